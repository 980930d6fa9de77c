"""The infragent command line (one typer app)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

import typer

from infragent.engine.knobs import knob_options

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="infragent: an infrastructure agent for LLM inference, and the engine it tunes.")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


# the engine knobs quality takes: what it compares against fp32
QUALITY_KNOBS = ("kv_cache_dtype", "kv_cache_dtypes", "quantization", "smoothquant_alpha")


@app.command()
@knob_options()
def generate(
    prompts: List[str] = typer.Argument(..., help="One or more prompts."),
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M) or hybrid (KDA + attention)."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0, help="0 means greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 or -1 disables the top-k cut."),
    seed: Optional[int] = typer.Option(None),
    stop: List[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each prompt in the model's chat template."),
    *,
    knobs: dict[str, Any],
) -> None:
    """Print the completion of each prompt (one per line block); errors go to stderr with exit status 2."""
    from infragent.engine.config import ConfigError
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import RequestError, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, stop=list(stop))
    try:
        params.validate()
        llm = LLM(model=model, **knobs)
        if chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        else:
            outputs = llm.generate(list(prompts), params)
        llm.close()
    except (ConfigError, RequestError, FileNotFoundError) as err:
        _fail(str(err))
        return
    failed = False
    for out in outputs:
        if out.error:
            typer.echo(f"error: request {out.request_id}: {out.error}", err=True)
            failed = True
        else:
            sys.stdout.write(out.text + "\n")
    sys.stdout.flush()
    if failed:
        raise typer.Exit(2)


def _emit(feedback, as_json: bool, verbose: bool = False) -> None:
    """Print a probe's Feedback (JSON or text; compact unless verbose) and exit 1 when its verdict is fail."""
    from infragent.probes.compact import compact_json, render_compact

    if verbose:
        typer.echo(feedback.to_json() if as_json else feedback.render())
    else:
        typer.echo(compact_json(feedback) if as_json else render_compact(feedback))
    if feedback.verdict == "fail":
        raise typer.Exit(1)


INPUTS_STYLE_HELP = ("trial: the factory is called as factory(trial, generator); seed: as factory(seed), one int "
                     "per trial.")


def _factory(name: str, style: str, what: str = "--inputs"):
    """An inputs factory from module:function, adapted to its style (probes/inputs.inputs_factory)."""
    from infragent.probes.inputs import InputsError, inputs_factory

    try:
        return inputs_factory(_resolve(name, what), style, what)
    except InputsError as err:
        _fail(str(err))


def _resolve(name: str, what: str):
    from infragent.probes.callables import CallableError, resolve

    try:
        return resolve(name, what)
    except CallableError as err:
        _fail(str(err))


@app.command()
def check(
    candidate: str = typer.Argument(..., help="module:function under test."),
    reference: str = typer.Option(..., "--reference", help="module:function giving the right answer."),
    inputs: str = typer.Option(..., "--inputs", help="module:function (trial, generator) -> arguments."),
    partition: Optional[str] = typer.Option(None, "--partition", help="e.g. column:4, row:4, heads:4:dim=1, splitk:4, batch:2."),
    trials: int = typer.Option(24, "--trials", help="Random input draws (fresh inputs each)."),
    inputs_style: str = typer.Option("trial", "--inputs-style", help=INPUTS_STYLE_HELP),
    budget_s: float = typer.Option(60.0, "--budget-s", help="Most seconds; past it the check stops and says so."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Compare a candidate with a reference over fresh random inputs; localize where they differ."""
    from infragent.probes.check import PartitionError, run_check

    cand, ref, factory = (_resolve(candidate, "candidate"), _resolve(reference, "--reference"),
                          _factory(inputs, inputs_style))
    try:
        feedback = run_check(cand, ref, factory, partition=partition, trials=trials, budget_s=budget_s)
    except PartitionError as err:
        _fail(str(err))
        return
    _emit(feedback, as_json, verbose)


@app.command()
def bench(
    fn: str = typer.Argument(..., help="module:function to time."),
    vs: Optional[str] = typer.Option(None, "--vs", help="module:function to compare against (A/B, interleaved)."),
    inputs: Optional[str] = typer.Option(None, "--inputs", help="module:function (trial, generator) -> arguments."),
    budget_s: float = typer.Option(2.0, "--budget-s", help="Most seconds of measuring."),
    threads: int = typer.Option(2, "--threads", help="torch threads, fixed during the run."),
    inputs_style: str = typer.Option("trial", "--inputs-style", help=INPUTS_STYLE_HELP),
    metric: str = typer.Option("time", "--metric", help="time: wall time per call; return: the callable "
                               "returns the work it did (e.g. a fixed-duration loop) and bench compares work per "
                               "second."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Time a callable (or A/B two) with calibrated loops, repeats and a bootstrap CI."""
    from infragent.probes.bench import BenchError, run_bench

    a = _resolve(fn, "function")
    b = _resolve(vs, "--vs") if vs else None
    factory = _factory(inputs, inputs_style) if inputs else None
    try:
        feedback = run_bench(a, b, factory, budget_s=budget_s, threads=threads, names=(fn, vs), metric=metric)
    except BenchError as err:
        _fail(str(err))
        return
    _emit(feedback, as_json, verbose)


@app.command()
def record(
    workload: str = typer.Argument(..., help="module:function to run while recording spans."),
    output: str = typer.Option("trace.json", "-o", "--output", help="Chrome trace JSON (opens in Perfetto)."),
    budget_s: float = typer.Option(120.0, "--budget-s", help="Most seconds; past it the workload is stopped and "
                                                              "the spans so far are the (inconclusive) answer."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Run a workload with the span recorder on and write a Chrome trace."""
    from infragent.probes.record import run_record

    _emit(run_record(_resolve(workload, "workload"), output, budget_s=budget_s), as_json, verbose)


@app.command()
def gil(
    workload: str = typer.Argument(..., help="module:function that runs a multi-threaded workload."),
    timeout_s: float = typer.Option(120.0, "--budget-s", "--timeout-s",
                                    help="Most seconds; past it the workload is interrupted and the samples so far "
                                         "are the (inconclusive) answer."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Measure, per thread and span, how long each thread held or waited for the GIL."""
    from infragent.probes.gil import run_gil

    _resolve(workload, "workload")
    _emit(run_gil(workload, timeout_s=timeout_s), as_json, verbose)


@app.command()
def roofline(
    fn: str = typer.Argument(..., help="module:function to classify."),
    inputs: str = typer.Option(..., "--inputs", help="module:function (trial, generator) -> arguments."),
    reference: Optional[str] = typer.Option(None, "--reference", help="module:function doing only the useful work."),
    inputs_style: str = typer.Option("trial", "--inputs-style", help=INPUTS_STYLE_HELP),
    budget_s: float = typer.Option(1.0, "--budget-s", help="Seconds of timing per callable (stops before 2x)."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Count FLOPs and bytes, time the call, and say what bounds it (compute, memory or overhead)."""
    from infragent.probes.roofline import run_roofline

    ref = _resolve(reference, "--reference") if reference else None
    _emit(run_roofline(_resolve(fn, "function"), _factory(inputs, inputs_style), reference=ref, budget_s=budget_s),
          as_json, verbose)


@app.command()
def analyze(
    trace: str = typer.Argument(..., help="Trace file: ours, Chrome JSON or Kineto (.json or .json.gz)."),
    vs: Optional[str] = typer.Option(None, "--vs", help="Baseline trace: diff and attribute the change."),
    overlap: Optional[Tuple[str, str]] = typer.Option(
        None, "--overlap", help="A B: the share of A's time that B overlaps; A and B are span names, globs, "
                                "cat:NAME or thread:NAME."),
    top: int = typer.Option(10, "--top", help="Rows in the top-N lists."),
    metric: str = typer.Option("wall", "--metric", help="What the end-to-end time is called in the diff (e.g. TTFT)."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Attribute a trace: breakdown, thread-aware overlap, idle gaps, critical path; with --vs, the diff."""
    from infragent.probes.analyze import analyze as run_analyze
    from infragent.trace_model import TraceFormatError

    try:
        feedback = run_analyze(trace, vs, [overlap] if overlap else [], top=top, metric=metric)
    except TraceFormatError as err:
        _fail(str(err))
        return
    _emit(feedback, as_json, verbose)


@app.command()
@knob_options(QUALITY_KNOBS)
def quality(
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M) or hybrid (KDA + attention)."),
    windows: int = typer.Option(32, "--windows", help="Held-out text windows for perplexity and KL."),
    window: int = typer.Option(256, "--window", help="Tokens per window."),
    prompts: int = typer.Option(64, "--prompts", help="Prompts for greedy agreement."),
    budget_s: float = typer.Option(600.0, "--budget-s", help="Most seconds, loading included; past it no further "
                                                              "batch is scored and the answer is inconclusive."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
    *,
    knobs: dict[str, Any],
) -> None:
    """Quality gates of a quantized configuration vs fp32: perplexity, KL divergence, greedy agreement."""
    from infragent.engine.config import ConfigError
    from infragent.engine.quant.corpus import CorpusError
    from infragent.probes.quality import QualityPlan, quality_of

    try:
        feedback = quality_of(model, knobs, QualityPlan(windows=windows, window=window, prompts=prompts),
                              budget_s=budget_s)
    except (ConfigError, CorpusError, FileNotFoundError) as err:
        _fail(str(err))
        return
    _emit(feedback, as_json, verbose)


@app.command()
@knob_options()
def serve(
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M) or hybrid (KDA + attention)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8000),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name"),
    max_waiting: int = typer.Option(256, "--max-waiting", help="Queued requests beyond this get 429."),
    max_request_bytes: int = typer.Option(4 * 1024 * 1024, "--max-request-bytes",
                                          help="Request bodies larger than this get 413."),
    hybrid_config: Optional[str] = typer.Option(None, "--hybrid-config",
                                                help='JSON sizes for the hybrid model, e.g. \'{"hidden_size": 256}\'.'),
    shutdown_timeout: float = typer.Option(30.0, "--shutdown-timeout", help="Seconds in-flight requests get on SIGTERM."),
    disagg: bool = typer.Option(False, "--disagg", help="Disaggregate: a router, prefill and decode worker "
                                "processes, KV through a store (layer-wise with --kv-transfer-mode)."),
    prefill_workers: int = typer.Option(1, "--prefill-workers", help="--disagg: prefill worker processes."),
    decode_workers: int = typer.Option(1, "--decode-workers", help="--disagg: decode worker processes."),
    kv_store: str = typer.Option("shm", "--kv-store", help="--disagg: shm (shared memory) or tcp."),
    transfer_timeout: float = typer.Option(60.0, "--transfer-timeout", help="--disagg: seconds a request may "
                                           "spend in prefill + KV transfer, in waiting for admission, or "
                                           "between two tokens before it fails."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved engine config as JSON "
                                      "and exit, without loading the model."),
    *,
    knobs: dict[str, Any],
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API."""
    import json
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")

    from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
    from infragent.engine.disagg.router import DisaggConfig
    from infragent.engine.server.serve import make_server

    try:
        hybrid = HybridConfig(**json.loads(hybrid_config)) if hybrid_config else HybridConfig()
        config = EngineConfig(model=model, hybrid=hybrid, **knobs)
        if print_config:
            typer.echo(config.to_json())
            return
        import infragent

        logging.getLogger("infragent.serve").info("engine config: %s", config.to_json())
        logging.getLogger("infragent.serve").info("engine code: %s", Path(infragent.__file__).resolve().parent)
        split = (DisaggConfig(prefill_workers, decode_workers, kv_store, transfer_timeout) if disagg else None)
        server = make_server(config, host, port, api_key, max_waiting, shutdown_timeout, served_model_name,
                             log_level="info", disagg=split, max_request_bytes=max_request_bytes)
    except (ConfigError, FileNotFoundError) as err:
        _fail(str(err))
        return
    except (json.JSONDecodeError, TypeError) as err:
        _fail(f"--hybrid-config: {err}; give a JSON object of HybridConfig fields")
        return
    server.run()


@app.command()
def loadgen(
    base_url: str = typer.Option(..., "--base-url", help="Server root, e.g. http://127.0.0.1:8000"),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first /v1/models entry)."),
    endpoint: str = typer.Option("/v1/completions", "--endpoint", help="/v1/completions or /v1/chat/completions"),
    num_prompts: int = typer.Option(100, "--num-prompts"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency"),
    request_rate: float = typer.Option(float("inf"), "--request-rate", help="Requests/s; inf sends all at once."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape: 1 = Poisson, <1 burstier."),
    arrival: str = typer.Option("gamma", "--arrival", help="burst, constant, poisson or gamma."),
    dataset_name: str = typer.Option("random", "--dataset-name", help="random, file or sharegpt."),
    dataset_path: Optional[str] = typer.Option(None, "--dataset-path"),
    random_input_len: int = typer.Option(128, "--random-input-len"),
    random_output_len: int = typer.Option(128, "--random-output-len"),
    length_dist: str = typer.Option("fixed", "--length-dist", help="fixed, uniform or lognormal."),
    random_range_ratio: float = typer.Option(0.0, "--random-range-ratio"),
    vocab_size: int = typer.Option(49152, "--vocab-size", help="Token ids of random prompts are drawn below this."),
    goodput: List[str] = typer.Option([], "--goodput", help="SLOs in ms, e.g. ttft:500 tpot:50 (repeatable)."),
    warmup: int = typer.Option(2, "--warmup", help="Requests sent first and left out of the metrics."),
    repeats: int = typer.Option(1, "--repeats", help="Run N times; report medians with CIs across runs."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the prompts (default: fresh each run, so "
                                                          "no run is served from an earlier one's prefix cache)."),
    api_key: Optional[str] = typer.Option(None, "--api-key"),
    budget_s: float = typer.Option(600.0, "--budget-s", help="Most seconds for all repeats; past it nothing more "
                                                              "is sent and the finished requests are the answer."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Benchmark an OpenAI-compatible server end to end (vLLM bench serve metrics)."""
    from infragent.probes.load_datasets import DatasetError
    from infragent.probes.loadgen import LoadConfig, parse_goodput, run_loadgen

    try:
        slos = parse_goodput(goodput)
    except ValueError as err:
        _fail(f"--{err}")
        return
    config = LoadConfig(base_url=base_url, model=model, endpoint=endpoint, num_prompts=num_prompts,
                        max_concurrency=max_concurrency, request_rate=request_rate, burstiness=burstiness,
                        arrival=arrival, dataset_name=dataset_name, dataset_path=dataset_path,
                        random_input_len=random_input_len, random_output_len=random_output_len,
                        length_dist=length_dist, random_range_ratio=random_range_ratio, vocab_size=vocab_size,
                        goodput_ms=slos, warmup=warmup, repeats=repeats, seed=seed, api_key=api_key,
                        progress=not as_json, budget_s=budget_s)
    try:
        feedback = run_loadgen(config)
    except (DatasetError, ValueError, ConnectionError) as err:
        _fail(str(err))
        return
    _emit(feedback, as_json, verbose)


@app.command()
def optimize(
    spec: Optional[str] = typer.Argument(None, help="A spec TOML or a scenario-pack folder (default: the engine-slo pack)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the spec and print the plan; run nothing."),
    proposer: str = typer.Option("search", "--proposer", help="search (Optuna over the suspect knobs), llm (an "
                                 "OpenAI-compatible model with tools) or command (an external program: JSON on stdin, "
                                 "a patch out); llm and command patch the target's code (kernel folders, or [target] code = PATH) in a "
                                 "git worktree, never the user's tree."),
    command: Optional[str] = typer.Option(None, "--command", help="The program for --proposer command."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", help="Default: $INFRAGENT_LLM_BASE_URL or "
                                               "$OPENAI_BASE_URL."),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="Default: $INFRAGENT_LLM_MODEL or $OPENAI_MODEL."),
    budget_probes: int = typer.Option(12, "--budget-probes", help="Stop after this many probe runs."),
    budget_minutes: float = typer.Option(8.0, "--budget-minutes", help="Stop starting trials after this long."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue an interrupted run."),
    ledger_path: str = typer.Option(".infragent/ledger.sqlite", "--ledger"),
    feedback: str = typer.Option("ladder", "--feedback", help="ladder (default: diagnosis, then each proposal "
                                 "through the cheapest probes first) or e2e-only (every proposal judged end to end "
                                 "only: the ablation of the ladder)."),
) -> None:
    """Optimize a target within a spec's criteria: trace, hypotheses, proposals through check, local A/B,
    end-to-end and criteria; everything in the ledger; a summary and an HTML report at the end."""
    from infragent.agent.context import FEEDBACK_MODES, Budget
    from infragent.agent.summary import run_optimize
    from infragent.lab.spec import SpecError, load_spec, plan, resolve_spec

    try:
        path = resolve_spec(spec)
        parsed = load_spec(path)
    except SpecError as err:
        _fail(str(err))
        return
    for line in plan(parsed):
        typer.echo(line)
    if feedback not in FEEDBACK_MODES:
        _fail(f"--feedback {feedback}: choose one of {', '.join(FEEDBACK_MODES)}")
    if dry_run:
        return
    try:
        code_proposer = _code_proposer(proposer, command, llm_base_url, llm_model)
        run_optimize(path, _ledger_path(ledger_path, export_artifacts=True), Budget(budget_probes, budget_minutes),
                     resume, code_proposer, feedback)
    except (ValueError, RuntimeError) as err:
        _fail(str(err))


def _code_proposer(name: str, command: Optional[str], base_url: Optional[str], model: Optional[str]):  # noqa: ANN202
    """None for search; the llm or command proposer otherwise (errors name the missing flag or variable)."""
    if name == "search":
        return None
    if name == "command":
        from infragent.agent.command_proposer import CommandProposer

        if not command:
            raise ValueError("--proposer command needs --command 'PROGRAM ARGS' (it gets JSON on stdin, returns a patch)")
        return CommandProposer(command)
    if name == "llm":
        from infragent.agent.llm_proposer import LLMProposer

        return LLMProposer(base_url=base_url, model=model)
    raise ValueError(f"--proposer {name}: choose search, llm or command")


DEFAULT_LEDGER = ".infragent/ledger.sqlite"


def _ledger_path(ledger: str, export_artifacts: bool = False) -> str:
    """The ledger file as an absolute path, fixed once where the command starts: the loops start children in
    other folders (kernel gates in a pack or a worktree), where a relative path would point somewhere else.
    export_artifacts: also fix the probes' artifact folder ($INFRAGENT_ARTIFACTS, absolute) for children."""
    from pathlib import Path

    if export_artifacts:
        from infragent.probes.artifacts import export_artifact_dir

        export_artifact_dir()
    return str(Path(ledger).expanduser().resolve())


@app.command()
def measure(
    spec: str = typer.Argument(..., help="The spec TOML."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger", help="SQLite ledger file."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue an interrupted run by its id."),
) -> None:
    """Measure the spec's target on every scenario (baseline), recording each probe in the ledger."""
    from infragent.lab.ledger import Ledger, LedgerError
    from infragent.lab.measure import measure as run_measure
    from infragent.lab.spec import SpecError
    from infragent.lab.target import TargetError

    from infragent.lab.lifecycle import interrupt_on_sigterm

    interrupt_on_sigterm()
    try:
        run_id = run_measure(spec, Ledger(_ledger_path(ledger, export_artifacts=True)), resume,
                             log=lambda line: typer.echo(line, err=True))
    except (SpecError, LedgerError, TargetError, ValueError) as err:
        _fail(str(err))
        return
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # the run's note (what was stopped, how to resume) is already printed
    typer.echo(run_id)


@app.command()
def runs(
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    export: Optional[str] = typer.Option(None, "--export", help="Write every run as JSONL to this file."),
) -> None:
    """List the ledger's runs (or export them as JSONL)."""
    import time as _time

    from infragent.lab.ledger import Ledger, LedgerError

    try:
        book = Ledger(_ledger_path(ledger))
    except LedgerError as err:
        _fail(str(err))
        return
    if export:
        with open(export, "w") as f:
            for line in book.export_jsonl():
                f.write(line + "\n")
        return
    for run in book.runs():
        when = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(run["created"]))
        typer.echo(f"{run['id']:5d}  {when}  {run['kind']:8s} {run['status']:11s} {run['probes']:4d} probes  {run['spec']}"
                   + (f"\n       {run['note']}" if run.get("note") and run["status"] != "completed" else ""))


@app.command()
def show(
    run_id: int = typer.Argument(..., help="Run id (see `infragent runs`)."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show one run: its status and every recorded probe's verdict and finding."""
    import json as _json

    from infragent.lab.ledger import Ledger, LedgerError

    try:
        book = Ledger(_ledger_path(ledger))
        row = book.run(run_id)
    except LedgerError as err:
        _fail(str(err))
        return
    results = book.probe_results(run_id)
    from infragent.lab.criteria import describe

    from infragent.lab.trajectory import chains

    launches = book.launches(run_id)
    hypotheses = chains(book, run_id)
    candidates = book.candidates(run_id)
    if as_json:
        typer.echo(_json.dumps({"run": row, "launches": launches, "hypotheses": hypotheses, "candidates": candidates,
                                "probes": results}, indent=2))
        return
    typer.echo(f"run {run_id}: {row['kind']} {row['status']} spec={row['spec_path']}")
    if row.get("note"):
        typer.echo(f"  note: {row['note']}")
    for launch in launches:
        typer.echo(f"  launch {launch['role']:16s} process group {launch['pgid']}, port {launch['port']}: "
                   f"{launch['status']}")
    for r in results:
        typer.echo(f"  {r['key']:24s} [{r['probe']}] {r['verdict'].upper()}: {r['finding']}")
        for j in r["feedback"].get("details", {}).get("judgements", []):
            if j.get("metric") and "ci" in j:
                typer.echo(f"      {j['verdict'].upper():12s} {j['metric']} [{j.get('phase')}, bucket "
                           f"{j.get('bucket')}] {describe(j)}")
    if hypotheses:
        typer.echo("hypotheses (hypothesis -> probe -> verdict -> decision):")
    for h in hypotheses:
        probe = (f"{h['settled_by']} {h['probe_verdict'].upper()}" if h["settled_by"] and h["probe_verdict"]
                 else f"{h['probe']} (not run on the baseline)")
        typer.echo(f"  {h['key']:14s} {h['claim']}\n      -> {probe} -> {h['status'].upper()} -> {h['decision']}")
    for c in candidates:
        accepted = c["status"] == "measured" and c["feasible"]
        typer.echo(f"  candidate trial/{c['trial']} ({c.get('proposer', 'search')}"
                   + (f", tests {c['hypothesis']}" if c.get("hypothesis") else "") + "): "
                   + ("ACCEPTED" if accepted else c["status"].upper()) + f": {c['why'][:300]}")


@app.command()
def report(
    run_id: int = typer.Argument(..., help="Run id (see `infragent runs`)."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="HTML file (default: run-ID.html)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="A Chrome trace to show a timeline excerpt from."),
) -> None:
    """Write one self-contained HTML report of a run."""
    from infragent.lab.ledger import Ledger, LedgerError
    from infragent.lab.report import write_report
    from infragent.trace_model import TraceFormatError

    try:
        path = write_report(Ledger(_ledger_path(ledger)), run_id, output or f"run-{run_id}.html", trace)
    except (LedgerError, TraceFormatError) as err:
        _fail(str(err))
        return
    typer.echo(path)


@app.command()
def mcp(
    root: str = typer.Option(".", "--root", help="Workspace root: every path a tool takes must stay inside it."),
    tracebacks: bool = typer.Option(False, "--tracebacks", help="Add the traceback to a failed call's answer."),
) -> None:
    """Serve the probes, analyses, ledger queries and criteria evaluation as MCP tools over stdio."""
    import os

    from infragent.agent.mcp_server import build_server

    os.chdir(root)  # module:function names and the artifacts folder are the root's, wherever it was started
    build_server(".", tracebacks).run()


@app.command()
def version() -> None:
    """Print the infragent version."""
    from infragent import __version__

    typer.echo(__version__)


def main() -> None:
    """The console entry: a command ended by an interrupt exits 130, and an interrupt still pending while the
    process unwinds cannot turn that exit into a bare KeyboardInterrupt (a SIGINT death)."""
    import signal

    try:
        app()
        code: Any = 0
    except KeyboardInterrupt:
        code = 130
    except SystemExit as done:
        code = done.code
    if code == 130:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    main()
