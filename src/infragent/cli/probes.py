"""The probes' commands: check, bench, record, gil, roofline, analyze, quality, loadgen, diagnose; each prints a
Feedback."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import typer

from infragent.cli.common import INPUTS_STYLE_HELP, app, emit, fail, make_inputs, resolve
from infragent.engine.knobs import knob_options

# the engine knobs quality takes: what it compares against fp32
QUALITY_KNOBS = ("kv_cache_dtype", "kv_cache_dtypes", "quantization", "smoothquant_alpha", "weight_format")


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

    cand, ref, factory = (resolve(candidate, "candidate"), resolve(reference, "--reference"),
                          make_inputs(inputs, inputs_style))
    try:
        feedback = run_check(cand, ref, factory, partition=partition, trials=trials, budget_s=budget_s)
    except PartitionError as err:
        fail(str(err))
        return
    emit(feedback, as_json, verbose)


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
    html: Optional[str] = typer.Option(None, "--html", help="Also write the result as an HTML page with charts (offline)."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Time a callable (or A/B two) with calibrated loops, repeats and a bootstrap CI."""
    from infragent.probes.bench import BenchError, run_bench

    a = resolve(fn, "function")
    b = resolve(vs, "--vs") if vs else None
    factory = make_inputs(inputs, inputs_style) if inputs else None
    try:
        feedback = run_bench(a, b, factory, budget_s=budget_s, threads=threads, names=(fn, vs), metric=metric)
    except BenchError as err:
        fail(str(err))
        return
    emit(feedback, as_json, verbose, html)


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

    emit(run_record(resolve(workload, "workload"), output, budget_s=budget_s), as_json, verbose)


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

    resolve(workload, "workload")
    emit(run_gil(workload, timeout_s=timeout_s), as_json, verbose)


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

    ref = resolve(reference, "--reference") if reference else None
    emit(run_roofline(resolve(fn, "function"), make_inputs(inputs, inputs_style), reference=ref, budget_s=budget_s),
          as_json, verbose)


@app.command()
def analyze(
    trace: str = typer.Argument(..., help="Trace file: ours, Chrome JSON or Kineto (.json or .json.gz); or a folder "
                                          "of Kineto traces, one per rank."),
    vs: Optional[str] = typer.Option(None, "--vs", help="Baseline trace: diff and attribute the change."),
    overlap: Optional[Tuple[str, str]] = typer.Option(
        None, "--overlap", help="A B: the share of A's time that B overlaps; A and B are span names, globs, "
                                "cat:NAME or thread:NAME."),
    top: int = typer.Option(10, "--top", help="Rows in the top-N lists."),
    metric: str = typer.Option("wall", "--metric", help="What the end-to-end time is called in the diff (e.g. TTFT)."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write the result as an HTML page with charts (offline)."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Attribute a trace: breakdown, thread-aware overlap, idle gaps, critical path; with --vs, the diff."""
    from infragent.probes.analyze import analyze as run_analyze
    from infragent.trace_model import TraceFormatError

    try:
        feedback = run_analyze(trace, vs, [overlap] if overlap else [], top=top, metric=metric)
    except TraceFormatError as err:
        fail(str(err))
        return
    emit(feedback, as_json, verbose, html)


@app.command()
@knob_options(QUALITY_KNOBS)
def quality(
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M), hybrid (KDA + attention) or hybrid-moe (with MoE layers)."),
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
        fail(str(err))
        return
    emit(feedback, as_json, verbose)


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
    prompt_format: str = typer.Option("auto", "--prompt-format", help="Random prompts as tokens (ids) or text "
                                      "(decoded, re-encoded to the length within 2%); auto asks the server once."),
    goodput: List[str] = typer.Option([], "--goodput", help="SLOs in ms, e.g. ttft:500 tpot:50 (repeatable)."),
    warmup: int = typer.Option(2, "--warmup", help="Requests sent first and left out of the metrics."),
    repeats: int = typer.Option(1, "--repeats", help="Run N times; report medians with CIs across runs."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the prompts (default: fresh each run, so "
                                                          "no run is served from an earlier one's prefix cache)."),
    api_key: Optional[str] = typer.Option(None, "--api-key"),
    budget_s: float = typer.Option(600.0, "--budget-s", help="Most seconds for all repeats; past it nothing more "
                                                              "is sent and the finished requests are the answer."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write the result as an HTML page with charts (offline)."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result (every table and sample); by default a compact reply (at most 4 KB) that names the file holding the rest."),
) -> None:
    """Benchmark an OpenAI-compatible server end to end (vLLM bench serve metrics)."""
    from infragent.probes.load_datasets import DatasetError
    from infragent.probes.loadgen import LoadConfig, parse_goodput, run_loadgen

    try:
        slos = parse_goodput(goodput)
    except ValueError as err:
        fail(f"--{err}")
        return
    config = LoadConfig(base_url=base_url, model=model, endpoint=endpoint, num_prompts=num_prompts,
                        max_concurrency=max_concurrency, request_rate=request_rate, burstiness=burstiness,
                        arrival=arrival, dataset_name=dataset_name, dataset_path=dataset_path,
                        random_input_len=random_input_len, random_output_len=random_output_len,
                        length_dist=length_dist, random_range_ratio=random_range_ratio, vocab_size=vocab_size,
                        goodput_ms=slos, warmup=warmup, repeats=repeats, seed=seed, api_key=api_key,
                        progress=not as_json, budget_s=budget_s, prompt_format=prompt_format)
    try:
        feedback = run_loadgen(config)
    except (DatasetError, ValueError, ConnectionError) as err:
        fail(str(err))
        return
    emit(feedback, as_json, verbose, html)


@app.command()
def diagnose(
    base_url: str = typer.Option(..., "--base-url", help="The server's root, e.g. http://127.0.0.1:8000 (any "
                                 "OpenAI-compatible server: vLLM, SGLang, llama.cpp, ours)."),
    pid: Optional[int] = typer.Option(None, "--pid", help="The server's process (default: whoever listens on the "
                                      "URL's port, when the server is on this machine)."),
    pgid: Optional[int] = typer.Option(None, "--pgid", help="The server's process group, instead of --pid."),
    profile_dir: Optional[str] = typer.Option(None, "--profile-dir", help="Where the server writes its "
                                              "torch.profiler traces (VLLM_TORCH_PROFILER_DIR, "
                                              "SGLANG_TORCH_PROFILER_DIR, ours: serve --profile-dir)."),
    seconds: float = typer.Option(15.0, "--seconds", help="How long the load runs (and the server is read)."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight at once."),
    input_len: int = typer.Option(256, "--input-len", help="Prompt tokens per request."),
    output_len: int = typer.Option(64, "--output-len", help="Output tokens per request."),
    endpoint: str = typer.Option("/v1/completions", "--endpoint", help="/v1/completions or /v1/chat/completions"),
    prompt_format: str = typer.Option("text", "--prompt-format", help="text (as clients send it: the server "
                                      "tokenizes), tokens (ids), or auto."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first /v1/models entry)."),
    api_key: Optional[str] = typer.Option(None, "--api-key"),
    no_pyspy: bool = typer.Option(False, "--no-pyspy", help="Do not sample the server's Python stacks."),
    as_json: bool = typer.Option(False, "--json"),
    verbose: bool = typer.Option(False, "--verbose", help="The whole result; by default a compact reply (at most "
                                 "4 KB) that names the file holding the rest."),
) -> None:
    """What limits a running server: a short fresh-prompt load while its metrics, threads, Python stacks and
    profile are read; findings with their evidence and the knobs that act on them."""
    from infragent.probes.diagnose import DiagnoseConfig, DiagnoseError, run_diagnose

    if pid is not None and pgid is not None:
        fail("give --pid or --pgid, not both")
    config = DiagnoseConfig(base_url, pid=pid, pgid=pgid, profile_dir=profile_dir, seconds=seconds,
                            concurrency=concurrency, input_len=input_len, output_len=output_len, endpoint=endpoint,
                            model=model, api_key=api_key, pyspy=not no_pyspy, prompt_format=prompt_format)
    try:
        feedback = run_diagnose(config)
    except (DiagnoseError, ValueError) as err:
        fail(str(err))
        return
    emit(feedback, as_json, verbose)
