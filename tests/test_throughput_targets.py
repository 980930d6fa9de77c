"""The issue-25 target rows of benchmarks/throughput_report.py: one set per stored-block format the run has,
each judged on its whole interval (met, missed, or inconclusive), the AVX2 rows only where that engine ran."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from throughput_report import summarize  # noqa: E402

ROUNDS = 5


def _round(i: int, engines: dict[str, dict[str, float]]) -> dict:
    """One round's record: per engine its samples (tok/s) and RSS, a little noise per round."""
    wobble = 1 + 0.01 * (i % 3)
    return {"peaks": {"gemv_fp32_bytes_per_s": 2e10, "matmul_fp32_gflops": 200.0, "copy_bytes_per_s": 3e10},
            "engines": {name: {"samples": {k: v * wobble for k, v in s.items()}, "peak_rss_bytes": 9e8,
                               "peak_rss_after": {"c1": 5e8}}
                        for name, s in engines.items()}}


def test_each_format_gets_its_own_targets_judged_on_the_interval() -> None:
    engines = {
        "infragent": {"c1": 30, "c8": 100, "c32": 170, "prefill": 600, "c1_decode_only": 31},
        "infragent-gguf-a16": {"c1": 160, "c8": 400, "c32": 520, "prefill": 1200, "c1_decode_only": 170},
        "infragent-gguf-a16-avx2": {"c1": 110, "c8": 220, "c32": 300, "prefill": 700, "c1_decode_only": 120},
        "transformers": {"c1": 21, "c8": 100, "c32": 160, "prefill": 600},
        "llamacpp": {"c1": 100, "c8": 100, "c32": 100, "prefill": 400, "c1_decode_only": 133},
    }
    rounds = [_round(i, engines) for i in range(ROUNDS)]
    summary = summarize(rounds, list(engines), {})
    verdicts = {t["target"]: t["verdict"] for t in summary["targets"]}
    assert verdicts["batch-1 decode gguf-a16 >= 1.3x llama.cpp"] == "PASS"  # 1.6x
    assert verdicts["c=32 gguf-a16 >= 2x transformers"] == "PASS"  # 3.25x
    assert verdicts["c=32 gguf-a16 (AVX2) >= 2x transformers"] == "FAIL"  # 1.9x, the whole interval under
    assert verdicts["gguf-a16 peak RSS (load, warm-up and c=1) <= 0.6 GB"] == "PASS"
    assert verdicts["gguf-a16 peak RSS (the whole run, c=32's KV included) <= 0.6 GB"] == "FAIL"
    assert not any(name.startswith(("batch-1 decode gguf ", "c=32 gguf-a8")) for name in verdicts)  # not run


def test_an_avx2_only_run_is_judged_against_transformers_held_to_avx2_too() -> None:
    engines = {"infragent-gguf-a16-avx2": {"c1": 120, "c8": 250, "c32": 330, "prefill": 700},
               "transformers": {"c1": 20, "c8": 100, "c32": 170, "prefill": 650},
               "transformers-avx2": {"c1": 20, "c8": 90, "c32": 150, "prefill": 630}}
    summary = summarize([_round(i, engines) for i in range(ROUNDS)], list(engines), {})
    verdicts = {t["target"]: (t["verdict"], t["measured"]) for t in summary["targets"]}
    verdict, measured = verdicts["c=32 gguf-a16 (AVX2) >= 2x transformers (AVX2)"]
    assert verdict == "PASS" and measured.startswith("2.2"), measured  # 330 / 150, not 330 / 170
    assert verdicts["batch-1 decode gguf-a16 >= 1.3x llama.cpp"][0] == "n/a"  # neither side ran


def test_a_kv_dtype_variant_gets_its_own_whole_run_memory_row_and_a_floor() -> None:
    engines = {"infragent-gguf-a16": {"c1": 160, "c8": 400, "c32": 520, "prefill": 1200},
               "infragent-gguf-a16-kv-int8": {"c1": 150, "c8": 380, "c32": 500, "prefill": 1150}}
    rounds = [_round(i, engines) for i in range(ROUNDS)]
    for i, record in enumerate(rounds):
        for name, kv, per_token, peak in (("infragent-gguf-a16", "auto", 46080, 9.5e8 + i),
                                          ("infragent-gguf-a16-kv-int8", "int8", 11520 + 360, 5.1e8 + i)):
            record["engines"][name].update(resident_torch={"VmRSS": 218e6}, weight_nbytes=92e6, peak_rss_bytes=peak,
                                           kv_nbytes_per_token=per_token, kv_cache_dtype=kv)
    config = {"concurrency": {"c32": 32}, "prompt_len": 128, "max_tokens": 128}
    summary = summarize(rounds, list(engines), config)
    verdicts = {t["target"]: t["verdict"] for t in summary["targets"]}
    assert verdicts["gguf-a16 peak RSS (the whole run, c=32's KV included) <= 0.6 GB"] == "FAIL"
    assert verdicts["gguf-a16 peak RSS (the whole run, KV in int8) <= 0.6 GB"] == "PASS"
    floor = summary["memory"]["infragent-gguf-a16"]
    assert floor["kv_c32"] == 46080 * 32 * 256 and floor["floor"] == 218e6 + 92e6 + 46080 * 32 * 256  # 687 MB
    assert summary["memory"]["infragent-gguf-a16-kv-int8"]["floor"] < 0.6e9


def test_engine_names_carry_a_kv_dtype_before_the_avx2_mark() -> None:
    from engine_throughput import base_engine

    assert base_engine("infragent-gguf-a16-kv-int8") == "infragent-gguf-a16"
    assert base_engine("infragent-gguf-kv-bf16-avx2") == "infragent-gguf-avx2"
    assert base_engine("infragent-gguf-kv-int4") == "infragent-gguf-kv-int4"  # not a KV dtype: refused by name
    assert base_engine("transformers-kv-int8") == "transformers-kv-int8"  # only infragent has the knob


def test_the_default_path_and_gguf_a16_get_issue_50s_targets() -> None:
    engines = {"infragent-auto": {"c1": 90, "c8": 300, "c32": 430, "prefill": 640, "c1_decode_only": 95},
               "infragent-gguf-a16": {"c1": 160, "c8": 400, "c32": 520, "prefill": 1200, "c1_decode_only": 160},
               "transformers": {"c1": 20, "c8": 100, "c32": 160, "prefill": 600}}
    rounds = [_round(i, engines) for i in range(ROUNDS)]
    for record in rounds:
        for name in ("infragent-auto", "infragent-gguf-a16"):
            record["engines"][name]["weight_nbytes"] = 1e8  # roofline: 2e10 B/s / 1e8 B = 200 tok/s
    verdicts = {t["target"]: (t["verdict"], t["measured"])
                for t in summarize(rounds, list(engines), {})["targets"]}
    assert verdicts["c=32 auto >= 2.5x transformers"][0] == "PASS"  # 2.69x
    assert verdicts["prefill 512 auto >= 1.2x transformers"][0] == "FAIL"  # 1.07x
    assert verdicts["c=1 auto >= 4x transformers"][0] == "PASS"  # 4.5x
    assert verdicts["auto peak RSS (the whole run) <= 0.6 GB"][0] == "FAIL"  # 0.9 GB
    assert verdicts["c=32 gguf-a16 >= 3.5x transformers"][0] == "FAIL"  # 3.25x
    verdict, measured = verdicts["batch-1 gguf-a16 >= 0.85 of the roofline"]
    assert verdict == "FAIL" and measured.startswith("0.8"), measured  # 160 / 200 and a little above
