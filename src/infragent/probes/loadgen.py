"""loadgen: the end-to-end serving benchmark against any OpenAI-compatible endpoint (ours, vLLM, SGLang).

Requests stream; warm-up requests are sent first and excluded from the metrics (their records are kept,
flagged). Metrics follow vLLM `bench serve` (analysis/serving_metrics.py), per phase and per prompt-length
bucket. --repeats N runs the whole benchmark N times and reports each metric's median across runs with a
bootstrap CI. The JSON result keeps every raw per-request record.

Every run draws fresh prompts (a seed of its own, kept in the result) unless --seed is given, so a second
run is not served from the first one's prefix cache. Where the server exposes prefix-cache counters (ours,
vLLM), they are read before and after each run, and a run served from the cache beyond what its own prompts
share is flagged (load_cache.py).
"""
from __future__ import annotations

import asyncio
import functools
import gc
import math
import secrets
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infragent.analysis.serving_metrics import RequestRecord, ServingMetrics, by_bucket, serving_metrics
from infragent.analysis.stats import bootstrap_median
from infragent.probes.artifacts import save_json
from infragent.probes.budget import over_budget
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.load_arrivals import arrival_times
from infragent.probes.load_cache import CacheCheck, cache_check, read_counters
from infragent.probes.load_client import ConnectionPool, now_clock, stream_request
from infragent.probes.load_datasets import RequestSpec, as_text, file_requests, random_requests, sharegpt_requests


PREWARM = 16  # connections opened before the measured requests when concurrency is unlimited


@dataclass
class LoadConfig:
    """Everything one loadgen invocation needs (flag names follow vLLM bench serve)."""

    base_url: str
    model: str | None = None
    endpoint: str = "/v1/completions"
    num_prompts: int = 100
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrival: str = "gamma"  # burst | constant | poisson | gamma
    dataset_name: str = "random"  # random | file | sharegpt
    dataset_path: str | None = None
    random_input_len: int = 128
    random_output_len: int = 128
    length_dist: str = "fixed"
    random_range_ratio: float = 0.0
    lognormal_sigma: float = 0.5
    vocab_size: int = 49152
    ignore_eos: bool = True
    goodput_ms: dict[str, float] = field(default_factory=dict)  # e.g. {"ttft": 500, "tpot": 50}
    warmup: int = 2
    repeats: int = 1
    seed: int | None = None  # None: a fresh seed per invocation (kept in the result); give one to reproduce
    api_key: str | None = None
    progress: bool = True
    budget_s: float | None = None  # most seconds for all repeats, warm-up included; then stop and say so
    prompt_format: str = "auto"  # random prompts as "tokens" (ids) or "text"; auto: ask the server (prompt_format)


@dataclass
class LoadRun:
    """One benchmark pass: raw records, its duration and the metrics computed from them."""

    records: list[RequestRecord]
    duration_s: float
    metrics: ServingMetrics
    buckets: dict[str, ServingMetrics]
    stopped: bool = False  # the budget ended it: requests not done by then are not in the records
    cache: CacheCheck | None = None  # the server's prefix-cache use during the run, where it exposes counters


def build_requests(config: LoadConfig, n: int, seed: int) -> list[RequestSpec]:
    """The dataset's first n requests (random ones are drawn fresh from seed)."""
    if config.dataset_name == "random":
        requests = random_requests(n, config.random_input_len, config.random_output_len, config.vocab_size,
                                   config.length_dist, config.random_range_ratio, config.lognormal_sigma, seed)
        if config.endpoint.endswith("chat/completions") or config.prompt_format == "text":
            tokenizer = _tokenizer()  # chat and text-only servers take text: the ids decoded, lengths kept
            requests = as_text(requests, tokenizer.encode, tokenizer.decode, config.vocab_size, seed)
        return requests
    if not config.dataset_path:
        raise ValueError(f"--dataset-name {config.dataset_name}: needs --dataset-path")
    count = count_tokens  # lengths for buckets only; token counts come from the server's usage
    if config.dataset_name == "file":
        pool = file_requests(config.dataset_path, config.random_output_len, count)
    elif config.dataset_name == "sharegpt":
        pool = sharegpt_requests(config.dataset_path, count)
    else:
        raise ValueError(f"--dataset-name {config.dataset_name!r}: choose random, file or sharegpt")
    return [pool[i % len(pool)] for i in range(n)]


@functools.lru_cache(maxsize=1)
def _tokenizer():  # noqa: ANN202 - the engine's Tokenizer, loaded once, only when text must be made or counted
    from infragent.engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf()


def count_tokens(text: str) -> int:
    """Tokens in text by the SmolLM2 tokenizer: prompt lengths of text datasets, and output tokens of a server
    whose stream reports no usage (another model's tokenizer counts differently: usage is preferred)."""
    return len(_tokenizer().encode(text))


class PromptFormat(NamedTuple):
    """How random prompts go out, why, and the probe request that asked the server (a warm-up record)."""

    fmt: str  # tokens | text
    why: str
    probe: RequestRecord | None = None


PROBE_IDS = [1000, 1001, 1002, 1003]


def prompt_format(config: LoadConfig, model: str) -> PromptFormat:
    """"text" for chat endpoints and servers that refuse a token-id prompt (asked with a probe of a few ids,
    max_tokens 1, kept as a warm-up record by run_loadgen), else "tokens" (exact lengths). An explicit choice
    stands. Asked each time: a port may be another server's by the next run."""
    if config.prompt_format in ("tokens", "text"):
        return PromptFormat(config.prompt_format, "as asked")
    if config.prompt_format != "auto":
        raise ValueError(f"--prompt-format {config.prompt_format!r}: choose auto, tokens or text")
    if config.endpoint.endswith("chat/completions"):
        return PromptFormat("text", "a chat endpoint takes text")
    probe = RequestRecord(-1_000_000, len(PROBE_IDS), 1, warmup=True)
    try:
        answer = _ask(config, model, PROBE_IDS)
    except httpx.HTTPError as err:
        probe.error = f"prompt-format probe: {err}"
        return PromptFormat("tokens", "the server did not answer a token-id prompt; its requests will say why", probe)
    first = (answer.text.strip().splitlines() or [""])[0][:200]
    if answer.status_code == 200:
        usage = (answer.json().get("usage") or {}) if answer.headers.get("content-type", "").startswith(
            "application/json") else {}
        probe.success, probe.output_counted = True, "usage" if usage else ""
        probe.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        probe.output_tokens = int(usage.get("completion_tokens") or 0)
        return PromptFormat("tokens", "the server took a token-id prompt", probe)
    probe.error = f"HTTP {answer.status_code}: {first}"
    if answer.status_code in (400, 422):
        return PromptFormat("text", f"the server refused a token-id prompt (HTTP {answer.status_code}: {first})", probe)
    try:  # any other status (llama-cpp-python answers a validation error with 500): does text get through?
        text_ok = _ask(config, model, "Hello").status_code == 200
    except httpx.HTTPError:
        text_ok = False
    if text_ok:
        return PromptFormat("text", f"the server answered a token-id prompt with HTTP {answer.status_code} "
                                    f"({first}) and a text prompt with 200", probe)
    return PromptFormat("tokens", f"the server answered a token-id prompt with HTTP {answer.status_code}, and a text "
                                  "prompt no better; its requests will say why", probe)


def _ask(config: LoadConfig, model: str, prompt: list[int] | str) -> httpx.Response:
    """One non-streamed request of one token: how the server answers this kind of prompt."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    return httpx.post(f"{config.base_url.rstrip('/')}{config.endpoint}", json=body, headers=headers, timeout=60)


def request_body(config: LoadConfig, model: str, spec: RequestSpec) -> dict[str, Any]:
    """The JSON body for one request (streaming, usage included)."""
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_len, "stream": True, "temperature": 0.0,
                            "stream_options": {"include_usage": True}, "ignore_eos": config.ignore_eos}
    if config.endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def discover_model(config: LoadConfig) -> str:
    """--model, or the first model the server lists."""
    if config.model:
        return config.model
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        listed = httpx.get(f"{config.base_url.rstrip('/')}/v1/models", headers=headers, timeout=10).json()
        return listed["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as err:
        raise ConnectionError(f"--base-url {config.base_url}: cannot list models ({err}); is the server up? "
                              "or pass --model") from None


async def run_once(config: LoadConfig, model: str, seed: int, budget_s: float | None = None) -> LoadRun:
    """Warm up, then send num_prompts requests on the arrival schedule under the concurrency limit; at
    budget_s (warm-up included) send no more and cancel what is in flight. The server's prefix-cache
    counters, where it has them, are read before and after."""
    specs = build_requests(config, config.num_prompts, seed)
    before = read_counters(config.base_url, config.api_key)
    pool = ConnectionPool(config.base_url, config.api_key)
    clock = now_clock()
    until = None if budget_s is None else clock() + budget_s
    records = await warm_up(config, model, pool, clock, seed)
    offsets = arrival_times(len(specs), config.request_rate, config.burstiness, config.arrival, seed)
    with progress_bar(config, len(specs)) as advance:
        measured, duration = await send_requests(config, model, pool, clock, list(enumerate(specs)), offsets, advance,
                                                 until)
    pool.close()
    await asyncio.sleep(0)  # the closed connections' transports finish closing before asyncio.run ends the loop
    records.extend(measured)
    run = finish_run(config, records, duration)
    run.stopped = len(measured) < len(specs)
    run.cache = cache_check(before, read_counters(config.base_url, config.api_key), [s.prompt for s in specs])
    return run


async def warm_up(config: LoadConfig, model: str, pool: ConnectionPool, clock: Callable[[], float],
                  seed: int) -> list[RequestRecord]:
    """Send the warm-up requests one by one; their records are kept, flagged, and excluded from metrics."""
    records = []
    for i, spec in enumerate(build_requests(config, config.warmup, seed + 1_000_003) if config.warmup else []):
        record = RequestRecord(-1 - i, spec.prompt_len, spec.output_len, warmup=True)
        await stream_request(pool, config.endpoint, request_body(config, model, spec), record, clock)
        records.append(record)
    await pool.prewarm(min(config.max_concurrency or PREWARM, config.num_prompts))
    return records


async def send_requests(config: LoadConfig, model: str, pool: ConnectionPool, clock: Callable[[], float],
                        indexed: list[tuple[int, RequestSpec]], offsets: Sequence[float],
                        advance: Callable[[], None], until: float | None = None) -> tuple[list[RequestRecord], float]:
    """Send (index, request) pairs at their arrival offsets under the concurrency limit; records and duration.
    At clock() `until` none is sent any more and those in flight are cancelled: only finished ones are kept."""
    gate = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    start = clock()

    async def send(i: int, spec: RequestSpec) -> RequestRecord:
        record = RequestRecord(i, spec.prompt_len, spec.output_len)
        body = request_body(config, model, spec)
        if gate is None:
            await stream_request(pool, config.endpoint, body, record, clock)
        else:
            async with gate:
                await stream_request(pool, config.endpoint, body, record, clock)
        record.start_s -= start
        advance()
        return record

    collecting = gc.isenabled()
    gc.disable()  # a full collection mid-run is a multi-ms stall charged to whichever requests are in flight
    try:
        # One dispatcher sleeps until each arrival and starts that request then (as vLLM's bench does):
        # thousands of tasks created up front would all run their first step at once and stall the
        # first requests for milliseconds.
        tasks = []
        for offset, (i, spec) in zip(offsets, indexed):
            if until is not None and start + offset > until:
                break
            delay = start + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, spec)))
        records = await _finished(tasks, None if until is None else until - clock())
    finally:
        if collecting:
            gc.enable()
    return records, clock() - start  # as vLLM: from the first send until every request is done


async def _finished(tasks: list[asyncio.Task], timeout_s: float | None) -> list[RequestRecord]:
    """The records of the tasks done within timeout_s (all of them when None), in order; the rest cancelled."""
    if not tasks:
        return []
    if timeout_s is None:
        return list(await asyncio.gather(*tasks))
    done, pending = await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [t.result() for t in tasks if t in done]


def finish_run(config: LoadConfig, records: list[RequestRecord], duration: float) -> LoadRun:
    """A LoadRun with its metrics, overall and per prompt-length bucket. Output tokens of a server whose stream
    reported no usage are counted from the text it sent (re-tokenized)."""
    for record in records:
        if record.output_text:
            record.output_tokens, record.output_counted = count_tokens(record.output_text), "text"
            record.output_text = ""
        if record.success and record.output_counted != "usage" and not record.prompt_tokens:
            record.prompt_tokens = record.prompt_len  # no usage: the client's own count of what it sent
    return LoadRun(records, duration, serving_metrics(records, duration, config.goodput_ms or None),
                   by_bucket(records, duration, config.goodput_ms or None))


@contextmanager
def progress_bar(config: LoadConfig, total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar over total requests; yields the function that advances it by one."""
    with Progress(TextColumn("loadgen"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not config.progress, transient=True) as progress:
        task = progress.add_task("requests", total=total)
        yield lambda: progress.advance(task)


def run_loadgen(config: LoadConfig) -> Feedback:
    """Run the benchmark config.repeats times and return the Feedback (raw records in the evidence file)."""
    model = discover_model(config)
    if config.seed is None:
        config = replace(config, seed=fresh_seed())
    fmt, why, probe = prompt_format(config, model)
    config = replace(config, prompt_format=fmt)
    start = time.monotonic()
    runs: list[LoadRun] = []
    for r in range(config.repeats):
        left = None if config.budget_s is None else config.budget_s - (time.monotonic() - start)
        if left is not None and left <= 0:
            break
        runs.append(asyncio.run(run_once(config, model, config.seed + r, left)))
        if runs[-1].stopped:
            break
    if probe is not None and runs:
        runs[0].records.insert(0, probe)  # a real request the server counted: kept, as a warm-up
    feedback = to_feedback(config, model, runs)
    feedback.locality["prompts"] = f"{fmt}: {why}"
    if len(runs) < config.repeats or runs[-1].stopped:
        done = sum(r.metrics.completed for r in runs)
        had = f"{len(runs)} of {config.repeats} repeats, {done} of {config.num_prompts * config.repeats} requests done"
        return over_budget(feedback, config.budget_s or 0.0, time.monotonic() - start, had)
    return feedback


SUMMARY = (("request_throughput", "req/s"), ("output_throughput", "tok/s"), ("total_token_throughput", "tok/s"))
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def fresh_seed() -> int:
    """A seed no earlier run used (in all likelihood): 48 random bits."""
    return secrets.randbits(48)


def to_feedback(config: LoadConfig, model: str, runs: list[LoadRun]) -> Feedback:
    """Numbers (median across repeats with a CI), per-phase and per-bucket details, raw records as evidence."""
    numbers: dict[str, Measure] = {}

    def across(name: str, values: list[float], unit: str) -> None:
        s = bootstrap_median(values)
        numbers[name] = Measure(s.median, unit, s.lo if len(values) > 1 else None,
                                s.hi if len(values) > 1 else None, len(values))

    for name, unit in SUMMARY:
        across(name, [getattr(r.metrics, name) for r in runs], unit)
    if config.goodput_ms:
        across("goodput", [r.metrics.goodput or 0.0 for r in runs], "req/s")
    for name in LATENCIES:
        for stat in ("median", "p99"):
            across(f"{name.removesuffix('_ms')}_{stat}_ms", [getattr(getattr(r.metrics, name), stat) for r in runs], "ms")
    failed = sum(r.metrics.failed for r in runs)
    errors = [rec.error for r in runs for rec in r.records if not rec.success and not rec.warmup][:5]
    verdict = "pass" if failed == 0 else "fail"
    m = runs[-1].metrics
    finding = (f"{m.completed} requests in {m.duration_s:.1f}s: {numbers['output_throughput'].value:.1f} output tok/s, "
               f"TTFT p99 {numbers['ttft_p99_ms'].value:.0f} ms, TPOT median {numbers['tpot_median_ms'].value:.1f} ms"
               + (f"; {failed} failed ({errors[0]})" if failed else ""))
    completed = sum(r.metrics.completed for r in runs)
    if failed and not completed:
        verdict, finding = "fail", f"every request failed ({failed}): {errors[0] if errors else 'no reason given'}"
    elif completed and not sum(rec.output_tokens for r in runs for rec in r.records
                               if rec.success and not rec.warmup):
        verdict = "fail"
        finding += ("; no output tokens counted: the server's stream gave neither usage nor text, so throughput "
                    "and TPOT mean nothing")
    cached = [r.cache for r in runs if r.cache is not None and r.cache.flagged]
    if cached:
        worst = max(cached, key=lambda c: c.hit_rate)
        verdict = "inconclusive" if verdict == "pass" else verdict
        finding += (f"; WARNING: {len(cached)} of {len(runs)} runs were served from the prefix cache (hit rate "
                    f"{worst.hit_rate:.0%} where the prompts share {worst.implied:.0%}): earlier requests warmed "
                    "it, so these latencies are not a fresh workload's; run without --seed (fresh prompts)")
    result = {"config": asdict(config), "model": model,
              "runs": [{"duration_s": r.duration_s, "metrics": asdict(r.metrics), "phases": r.metrics.phases(),
                        "prefix_cache": r.cache.to_dict() if r.cache is not None else None,
                        "buckets": {b: {"metrics": asdict(bm), "phases": bm.phases()} for b, bm in r.buckets.items()},
                        "records": [asdict(rec) for rec in r.records]} for r in runs]}
    evidence = save_json("loadgen", result, "config, per-run metrics by phase and bucket, raw per-request records")
    return Feedback("loadgen", verdict, finding, numbers=numbers,
                    locality={"base_url": config.base_url, "model": model, "endpoint": config.endpoint, "seed": config.seed,
                              "dataset": config.dataset_name, "request_rate": config.request_rate,
                              "max_concurrency": config.max_concurrency or "unlimited"},
                    evidence=[evidence],
                    next_probes=["infragent record on the server while loadgen runs (where the time goes)"],
                    details={"runs": [{k: v for k, v in run.items() if k != "records"} for run in result["runs"]],
                             "raw": result["runs"][-1]["records"]})


def parse_goodput(items: list[str]) -> dict[str, float]:
    """SLOs from 'ttft:500 tpot:50' style items (ms; commas or spaces between them)."""
    slos: dict[str, float] = {}
    for item in (part for group in items for part in group.replace(",", " ").split()):
        name, _, value = item.partition(":")
        try:
            if name not in ("ttft", "tpot", "e2el"):
                raise ValueError
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput {item!r}: use ttft:MS, tpot:MS or e2el:MS") from None
    return slos
