"""The knob registry (engine/knobs.py): every EngineConfig knob has an `infragent serve` flag; each one
round-trips through the real `serve --print-config` parse, and reaches a launched server, proven by the
`engine config:` line in its log."""
from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from infragent.cli import app, generate, quality, serve
from infragent.engine.config import EngineConfig, HybridConfig
from infragent.engine.knobs import KNOBS, KnobError, from_argv, to_argv
from infragent.lab.spec import SpecError, Target, load_spec
from infragent.lab.target import TargetError, TargetProcess, engine_config, launch_command
from server_fixture import TINY_HYBRID

NOT_KNOBS = {"model", "gguf_path", "hybrid"}
SERVE_ARGS = ["--hybrid-config", json.dumps(TINY_HYBRID), "--max-model-len", "512", "--kv-cache-gb", "0.05",
              "--threads", "1"]
ATTENTION_LAYERS = HybridConfig(**TINY_HYBRID).layer_kinds().count("attention")

# One launch each; together they give every knob a non-default value. They are split where EngineConfig
# forbids a combination: tp and pp exclude each other and speculative, quantization, kv_transfer and a
# non-torch gemm; quantization needs gemm torch; a quantized KV dtype needs the paged layout; a weight format
# other than fp32 excludes all of these.
LAUNCHES = {
    "tensor-parallel": {"tensor_parallel_size": 2, "tp_partial_precision": "reduced", "dtype": "bfloat16",
                        "kernels": "torch", "enable_prefix_caching": False, "block_size": 32, "max_num_seqs": 4,
                        "max_num_batched_tokens": 128, "max_model_len": 256, "kv_cache_gb": 0.04,
                        "num_threads": 1},
    "pipeline-parallel": {"pipeline_parallel_size": 2, "pp_micro_batches": 3, "kv_layout": "contiguous",
                          "decode_stack": "off",
                          "tokenizer_mode": "slow"},
    "speculative": {"speculative": "draft", "num_speculative_tokens": 2, "draft_layers": 1, "draft_window": 32,
                    "prompt_lookup_max": 3, "prompt_lookup_min": 1, "rollback": "replayssm", "rollback_window": 5,
                    "kv_transfer": True, "kv_transfer_mode": "after_prefill", "kv_transfer_impl": "bulk",
                    "gemm": "blas", "kv_cache_dtypes": ["int8"] * ATTENTION_LAYERS, "kda_decode_impl": "reference",
                    "kda_bv_tile": 16, "kda_head_split": 2},
    "quantized": {"quantization": "w8a8", "smoothquant_alpha": 0.5, "kv_cache_dtype": "int8"},
    "int8-weights": {"weight_format": "int8"},  # gguf needs the real model's file: tests/test_weight_format.py
    "expert-parallel": {"expert_parallel_size": 2, "moe_exchange": "native"},  # experts: model hybrid-moe
}


def model_of(values: dict) -> str:
    """The model a launch runs: expert parallelism needs one with experts."""
    return "hybrid-moe" if "expert_parallel_size" in values else "hybrid"


def launch_of(name: str) -> dict:
    """The launch that sets this knob (its companions included)."""
    found = [values for values in LAUNCHES.values() if name in values]
    assert found, f"knob {name}: no launch gives it a non-default value; add it to a LAUNCHES entry"
    return found[0]


def test_every_engine_config_field_but_model_gguf_and_hybrid_is_a_knob() -> None:
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields - NOT_KNOBS == set(KNOBS), "a new EngineConfig field needs knob metadata (_knob in config.py)"


def test_the_launches_cover_every_knob_with_a_non_default_value() -> None:
    given = [name for values in LAUNCHES.values() for name in values]
    assert sorted(given) == sorted(KNOBS)  # each knob in exactly one launch
    for name in KNOBS:
        assert launch_of(name)[name] != KNOBS[name].default, name


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_knob_round_trips_through_serve_print_config(name: str) -> None:
    values = launch_of(name)
    argv = ["serve", "--print-config", "--model", model_of(values), *SERVE_ARGS, *to_argv(values)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed[name] == values[name], f"{argv}: {name} printed as {printed[name]!r}"
    assert from_argv(to_argv(values)) == values


def test_print_config_shows_the_resolved_config_and_loads_nothing() -> None:
    result = CliRunner().invoke(app, ["serve", "--print-config", "--model", "hybrid", *SERVE_ARGS,
                                      "--tensor-parallel-size", "2", "--quantization", "none"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["hybrid"] == dataclasses.asdict(HybridConfig(**TINY_HYBRID))
    assert printed["tensor_parallel_size"] == 2 and printed["quantization"] is None
    assert set(printed) == {f.name for f in dataclasses.fields(EngineConfig)}


def test_generate_serve_and_quality_take_their_knobs_from_the_registry() -> None:
    for command in (generate, serve):
        assert set(KNOBS) <= set(inspect.signature(command).parameters), command.__name__
    assert {"quantization", "kv_cache_dtypes"} <= set(inspect.signature(quality).parameters)


def test_bad_flags_and_values_name_what_to_fix() -> None:
    with pytest.raises(KnobError, match="--max-num-seqs: 'many' is not a valid int"):
        from_argv(["--max-num-seqs", "many"])
    with pytest.raises(KnobError, match="--tp: needs a value"):
        from_argv(["--tp"])
    with pytest.raises(KnobError, match="rollback: None is not a value of --rollback"):
        to_argv({"rollback": None})
    with pytest.raises(KnobError, match="kv_transfer: 'yes' is not a bool"):
        to_argv({"kv_transfer": "yes"})
    assert to_argv({"quantization": None, "kv_transfer": False}) == ["--no-kv-transfer"]
    assert from_argv(["--port", "8001", "--disagg", "--tensor-parallel-size=2", "--no-enable-prefix-caching"]) == \
        {"tensor_parallel_size": 2, "enable_prefix_caching": False}
    with pytest.raises(TargetError, match=r"knobs \['max_num_seq'\]: not settable on the engine server; "
                                          r"settable: dtype, block_size"):
        launch_command(Target(kind="engine"), {"max_num_seq": 4})


def test_spec_validation_checks_engine_knobs_against_the_registry(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    text = ('[target]\nkind = "engine"\nmodel = "hybrid"\nserve_args = ["--max-model-len", "512"]\n\n'
            '[knobs.{name}]\ntype = "int"\ndomain = [1, 3]\n\n'
            '[[scenarios]]\nname = "s"\n\n[[criteria]]\nscenario = "s"\nmetric = "e2el_median_ms"\nmax = 1000\n')
    spec.write_text(text.format(name="draft_layers"))
    assert "draft_layers" in load_spec(spec).knobs
    spec.write_text(text.format(name="draft_layer"))
    with pytest.raises(SpecError, match="knobs.draft_layer: unknown knob for the engine target; known: dtype, "):
        load_spec(spec)
    spec.write_text(text.format(name="draft_layers").replace('"512"', '"long"'))
    with pytest.raises(SpecError, match="target.serve_args: --max-model-len: 'long' is not a valid int"):
        load_spec(spec)


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_a_launched_engine_target_runs_with_every_knob_it_was_given(launch: str, tmp_path: Path) -> None:
    knobs = LAUNCHES[launch]
    target = Target(kind="engine", model=model_of(knobs), serve_args=SERVE_ARGS, ready_timeout_s=120)
    log = tmp_path / f"{launch}.log"
    with TargetProcess(target, knobs, log) as proc:
        body = {"prompt": "a b a b a b", "max_tokens": 4, "temperature": 0}
        response = httpx.post(f"{proc.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
    lines = [line for line in log.read_text().splitlines() if "engine config: " in line]
    assert len(lines) == 1, log.read_text()[-2000:]
    logged = json.loads(lines[0].split("engine config: ", 1)[1])
    for name, value in knobs.items():
        assert logged[name] == value, f"{launch}: {name} launched as {logged[name]!r}, given {value!r}"
    assert logged == json.loads(engine_config(target, knobs).to_json())  # serve_args parsed alike
