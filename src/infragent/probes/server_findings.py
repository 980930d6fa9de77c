"""What limits a serving stack, read from the outside: rules over the server's metrics, the client's own
request records, the server's threads and its Python stacks. Each bottleneck names its evidence and the
kinds of knobs that act on it (acts_on.py: the vocabulary a spec's knob `acts_on` uses too).

A rule that cannot be judged (its source missing) says nothing; the diagnosis says what it could not see.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.serving_metrics import RequestRecord
from infragent.probes.server_metrics import MetricsSeries
from infragent.probes.server_stacks import TOKENIZATION, StackSampling
from infragent.probes.server_threads import ThreadReading

QUEUED_SHARE = 0.3  # of the readings taken while requests ran: waiting > 0 this often is a queue, not a blip
QUEUE_DEPTH = 0.2  # of the offered concurrency: a median queue at least this deep (and at least 2)
PINNED_SHARE = 0.7  # of the queued readings: the running batch at its ceiling this often is a cap
PINNED_AT_LIMIT = 0.5  # ... or this often when that ceiling is the limit the launch line sets
HELD_BACK = 0.5  # below a limit: the running batch holds at most this share of the offered requests
KV_FULL = 0.9
TOKENIZING_SHARE = 0.15  # of all on-CPU Python samples
HOT_SHARE = 0.2
STARVED_SHARE = 0.3  # of a busy thread's runnable time spent waiting for a core
CONTENDED_CORES = 0.5  # other processes using this much CPU make the machine contended
BUSY_THREAD = 0.85  # of the watch: a thread on a core this much is the one doing the work
IDLE_CORES = 0.7  # the server leaving at least this much of the machine unused
INTERFERENCE_RATIO = 1.5
REFUSED_SHARE = 0.05  # of the measured requests answered 429/503
CUT_SHORT = 0.5  # a request that got less than this share of the tokens it asked for was cut short ...
CUT_SHARE = 0.3  # ... and this share of the measured requests cut short is the server's doing, not a blip
BUSY_CPU = 0.05  # of the watch: a thread on a core less than this is not one of the server's busy threads
# launch flags that set the running-batch limit, by stack
BATCH_LIMIT_FLAGS = ("--max-num-seqs", "--max-running-requests", "--parallel", "-np", "--max-batch-size",
                     "--max_concurrent_requests")


@dataclass
class Bottleneck:
    """One limit the evidence points at: its kind, the claim, the evidence lines, and what acts on it."""

    kind: str
    claim: str
    evidence: list[str]
    acts_on: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict:
        """A JSON-ready copy."""
        return {"kind": self.kind, "claim": self.claim, "evidence": self.evidence, "acts_on": self.acts_on,
                "fix": self.fix}


def launch_limit(cmdline: list[str]) -> tuple[str, int] | None:
    """The running-batch limit a launch line sets ('--max-num-seqs', 2), if it sets one."""
    for i, part in enumerate(cmdline):
        flag, _, value = part.partition("=")
        if flag in BATCH_LIMIT_FLAGS:
            value = value or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            if re.fullmatch(r"\d+", value):
                return flag, int(value)
    return None


def queueing(series: MetricsSeries, limit: tuple[str, int] | None, offered: int | None) -> Bottleneck | None:
    """Requests waiting while the running batch sits at a ceiling (a batch limit), or below its limit with the
    KV cache not full (admission held back by the token budget)."""
    rows = [s.values for s in series.scrapes if s.values.get("running", 0) > 0 or s.values.get("waiting", 0) > 0]
    queued = [v for v in rows if v.get("waiting", 0) > 0]
    if not rows or "waiting" not in rows[0] or len(queued) < QUEUED_SHARE * len(rows) or len(queued) < 3:
        return None
    running = [v.get("running", 0.0) for v in queued]
    ceiling = max(running)
    pinned = sum(r >= ceiling for r in running) / len(running)
    kv = [v["kv_usage"] for v in queued if "kv_usage" in v]
    kv_text = f"; KV cache {statistics.median(kv):.0%} used" if kv else "; KV use not exposed"
    if kv and statistics.median(kv) >= KV_FULL:
        return None  # the KV rule speaks for this queue
    waited = statistics.median(v["waiting"] for v in queued)
    if waited < max(2.0, QUEUE_DEPTH * (offered or 0)):
        return None  # one request between a finish and the next step's admission is not a queue
    evidence = [f"{series.family} metrics: waiting > 0 in {len(queued)} of {len(rows)} readings under load "
                f"(median {waited:g} waiting){kv_text}"]
    if offered:
        evidence.append(f"the load offered {offered} concurrent requests")
    reached = limit is not None and ceiling >= limit[1]
    set_by = f" ({limit[0]} {limit[1]} on the launch line)" if reached else ""
    if pinned >= (PINNED_AT_LIMIT if reached else PINNED_SHARE) and (limit is None or reached):
        evidence.append(f"the running batch sat at {ceiling:g}{set_by} in {pinned:.0%} of those readings")
        return Bottleneck("queueing at the batch limit",
                          f"queueing-bound: requests wait while the running batch is held at {ceiling:g}{set_by}",
                          evidence, ["batch_limit"],
                          "raise the running-batch limit (max_num_seqs / max-running-requests / parallel slots)")
    usual = statistics.median(v.get("running", 0.0) for v in rows)  # over every reading under load
    if (offered and max(usual, statistics.median(running)) > HELD_BACK * offered) \
            or waited < statistics.median(running):
        return None  # most of what is offered runs most of the time: requests in transit between waves
    below = f"its limit ({limit[0]} {limit[1]})" if limit is not None else f"its own peak of {ceiling:g}"
    evidence.append(f"the running batch was below {below} in {1 - pinned:.0%} of those readings")
    return Bottleneck("queueing below the batch limit",
                      f"queueing-bound: requests wait while the running batch stays below {below}; admission is "
                      "held back by something else (the tokens per step, or KV blocks)",
                      evidence, ["prefill_chunk", "kv_capacity"],
                      "raise the tokens per step (max_num_batched_tokens) or the KV cache")


def kv_capacity(series: MetricsSeries) -> Bottleneck | None:
    """The KV cache near full, or requests preempted to make room."""
    kv = series.values("kv_usage")
    preempted = series.increase("preemptions") or 0.0
    waiting = series.values("waiting")
    full = sum(u >= KV_FULL for u in kv)
    if not preempted and (not kv or full < QUEUED_SHARE * len(kv)):
        return None
    evidence = []
    if kv:
        evidence.append(f"{series.family} metrics: KV cache ≥ {KV_FULL:.0%} used in {full} of {len(kv)} readings "
                        f"(peak {max(kv):.0%})")
    if preempted:
        evidence.append(f"{preempted:g} requests preempted (evicted and recomputed) during the load")
    if waiting and max(waiting) > 0:
        evidence.append(f"up to {max(waiting):g} requests waiting")
    return Bottleneck("KV capacity", "KV-capacity-bound: the KV cache is full"
                      + (" and requests are preempted" if preempted else ""), evidence, ["kv_capacity"],
                      "give the KV cache more memory (kv-cache-gb / gpu-memory-utilization), shorter contexts, "
                      "or a smaller KV dtype")


def cut_short(records: list[RequestRecord]) -> Bottleneck | None:
    """Requests that succeeded with far fewer tokens than they asked for: ended by the server without a finish
    reason (a new request interrupting it), at its context length, or by the model where the server ignores
    ignore_eos (then the load is shorter than asked, which the figures must say)."""
    done = [r for r in records if r.success and not r.warmup and r.output_len > 1]
    short = [r for r in done if r.output_tokens < CUT_SHORT * r.output_len]
    if len(done) < 4 or len(short) < CUT_SHARE * len(done):
        return None
    asked = statistics.median(r.output_len for r in short)
    got = statistics.median(r.output_tokens for r in short)
    reasons = Counter(r.finish_reason or "none" for r in short).most_common()
    said = ", ".join(f"{n} {'without a finish_reason' if k == 'none' else f'finish_reason={k!r}'}"
                     for k, n in reasons)
    evidence = [f"client records: {len(short)} of {len(done)} requests got a median {got:g} of the {asked:g} "
                f"tokens they asked for ({said})"]
    cause = reasons[0][0]
    if cause == "stop":
        return Bottleneck("cut short by the model", f"shorter than asked: {len(short)} of {len(done)} requests "
                          f"ended at the model's end-of-text after a median {got:g} of {asked:g} tokens (the "
                          "server ignores ignore_eos): the load measured is shorter than the one asked for",
                          evidence, [], "compare figures only at equal output lengths, or use a server that "
                          "honours ignore_eos")
    if cause == "length":
        return Bottleneck("cut short at the context", f"cut short at the context: {len(short)} of {len(done)} "
                          f"requests stopped at length after a median {got:g} of {asked:g} tokens", evidence,
                          ["kv_capacity"], "a longer context per request (n_ctx / max-model-len / context per slot)")
    return Bottleneck("cut short", f"cut short: {len(short)} of {len(done)} requests ended after a median {got:g} "
                      f"of the {asked:g} tokens asked, without a finish_reason: the server stopped them (a new "
                      "request interrupting the one it serves, or a server that serves one at a time)", evidence,
                      ["batch_limit"], "serve requests side by side, or queue them instead of interrupting "
                      "(parallel slots, interrupt_requests false)")


def serialized(records: list[RequestRecord], offered: int | None) -> Bottleneck | None:
    """A server that generates for one request at a time although several were in flight (client side only)."""
    done = [r for r in records if r.success and not r.warmup and r.output_tokens > 1]
    if len(done) < 4 or not offered or offered < 2:
        return None
    windows = sorted((r.start_s + r.ttft_s, r.start_s + r.latency_s) for r in done)
    most = _most_overlapping(windows)
    if most > 1:
        return None
    return Bottleneck("one request at a time",
                      f"serialized: the server streamed one request at a time while up to {offered} were sent",
                      [f"client records: of {len(done)} requests no two streamed tokens at once (their first-to-last "
                       "token windows never overlap)"], ["batch_limit"],
                      "serve several requests at once (parallel slots / continuous batching)")


def _most_overlapping(windows: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in windows] + [(b, -1) for _, b in windows], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def refused(records: list[RequestRecord]) -> Bottleneck | None:
    """Requests the server turned away under the load (429: its queue is full; 503: it is overloaded)."""
    measured = [r for r in records if not r.warmup]
    turned = [r for r in measured if re.match(r"HTTP (429|503)\b", r.error or "")]
    if not turned or len(turned) < REFUSED_SHARE * len(measured):
        return None
    first = turned[0].error.splitlines()[0][:160]
    return Bottleneck("refused requests", f"admission-bound: the server refused {len(turned)} of {len(measured)} "
                      "requests under this load", [f"client records: {first}"], ["batch_limit"],
                      "a longer waiting queue (--max-waiting, max-queue) or more requests served at once")


def prefill_interference(records: list[RequestRecord]) -> Bottleneck | None:
    """Inter-token gaps that span another request's prefill (its start to its first token), against gaps
    that span none (client side only)."""
    done = [r for r in records if r.success and not r.warmup]
    starts = np.array([r.start_s for r in done])
    firsts = starts + np.array([r.ttft_s for r in done])
    during, clear = [], []
    for i, r in enumerate(done):
        gaps = np.asarray(r.itl_s, dtype=float)
        if not len(gaps):
            continue
        ends = firsts[i] + np.cumsum(gaps)
        begins = ends - gaps
        spans = (starts[None, :] < ends[:, None]) & (firsts[None, :] > begins[:, None])
        spans[:, i] = False  # its own prefill is not interference
        hit = spans.any(axis=1)
        during.extend(gaps[hit].tolist())
        clear.extend(gaps[~hit].tolist())
    if len(during) < 10 or len(clear) < 10:
        return None
    ratio = statistics.median(during) / max(statistics.median(clear), 1e-9)
    if ratio < INTERFERENCE_RATIO:
        return None
    return Bottleneck("prefill interference",
                      f"prefill interference: a token gap that spans another request's prefill is x{ratio:.1f} "
                      "the others",
                      [f"client records: ITL median {statistics.median(during) * 1e3:.1f} ms over {len(during)} gaps "
                       f"during prefills vs {statistics.median(clear) * 1e3:.1f} ms over {len(clear)} without"],
                      ["prefill_chunk"], "chunk prefills smaller (max_num_batched_tokens) or disaggregate prefill")


def tokenization(sampling: StackSampling | None, requests: int = 0) -> Bottleneck | None:
    """Tokenization (or detokenization) taking a large share of the server's on-CPU Python samples; with the
    requests served meanwhile, the CPU time it cost each."""
    if sampling is None or not sampling.total():
        return None
    busy = [t for t in sampling.threads if t.tokenizing]
    held = sum(t.tokenizing for t in busy)
    share = held / sampling.total()
    if share < TOKENIZING_SHARE:
        return None
    top = max(busy, key=lambda t: t.tokenizing)
    function = top.tokenizing_functions.most_common(1)[0][0]
    threads = ", ".join(f"'{t.name or t.tid}' {t.tokenizing}" for t in sorted(busy, key=lambda t: -t.tokenizing)[:3])
    return Bottleneck("tokenization", f"tokenization holds the serving process: {share:.0%} of its on-CPU Python "
                      f"samples are in tokenization, most in {function}",
                      [f"py-spy: {held} of {sampling.total()} samples at {sampling.rate_hz} Hz in tokenization "
                       f"frames (threads: {threads})"]
                      + ([f"about {held / sampling.rate_hz / requests * 1e3:.1f} ms of tokenization CPU per request "
                          f"({requests} requests)"] if requests else []), ["tokenizer"],
                      "a fast (native) tokenizer, tokenization off the serving process, or fewer tokens per request")


def hot_function(sampling: StackSampling | None, skip_tokenization: bool) -> Bottleneck | None:
    """One function holding a large share of all on-CPU Python samples."""
    if sampling is None or not sampling.total():
        return None
    counts: dict[str, int] = {}
    for t in sampling.threads:
        for function, n in t.functions.items():
            counts[function] = counts.get(function, 0) + n
    function, n = max(counts.items(), key=lambda kv: kv[1])
    if n < HOT_SHARE * sampling.total() or (skip_tokenization and TOKENIZATION.search(function)):
        return None
    return Bottleneck("hot function", f"hot function: {function} is {n / sampling.total():.0%} of the server's "
                      "on-CPU samples", [f"py-spy: {n} of {sampling.total()} samples (Python frames: native code a "
                                         "function calls counts under it)"], [], "")


def starved(threads: list[ThreadReading], cores: int, elapsed_s: float,
            others_cores: float | None) -> Bottleneck | None:
    """Busy threads that spent a large share of their runnable time waiting for a core: the server's own
    threads beyond the cores (a threads knob acts), or other processes on the machine (none does)."""
    if elapsed_s <= 0:
        return None
    busy = [t for t in threads if t.cpu_s >= BUSY_CPU * elapsed_s]  # a thread waking now and then is not starved
    hungry = [t for t in busy if t.runqueue_s / (t.cpu_s + t.runqueue_s) >= STARVED_SHARE]
    if not hungry:
        return None
    worst = max(hungry, key=lambda t: t.runqueue_s)
    server_cores = sum(t.cpu_s for t in threads) / elapsed_s
    outside = None if others_cores is None else max(0.0, others_cores - server_cores)
    evidence = [f"/proc schedstat: '{worst.name}' (tid {worst.tid}) ran {worst.cpu_s:.2f} s and waited "
                f"{worst.runqueue_s:.2f} s for a core; the server used {server_cores:.2f} of {cores} cores"]
    share = f"'{worst.name}' {worst.runqueue_s / (worst.cpu_s + worst.runqueue_s):.0%} of its runnable time"
    if outside is not None and outside >= CONTENDED_CORES:
        evidence.append(f"other processes used {outside:.2f} cores meanwhile")
        return Bottleneck("contended machine", f"contended by other processes: the server's threads waited for a "
                          f"core ({share}) while other processes used {outside:.1f} cores; its figures are "
                          "disturbed", evidence, [], "diagnose again on a quiet machine")
    many = "1 busy thread" if len(hungry) == 1 else f"{len(hungry)} busy threads"
    return Bottleneck("starved threads", f"starved for CPU: {many} of the server waited for a core, {share}",
                      evidence, ["threads"],
                      "fewer threads per process (or processes) than cores")


def one_busy_thread(threads: list[ThreadReading], cores: int, elapsed_s: float,
                    others_cores: float | None) -> Bottleneck | None:
    """Under a load that keeps it busy, the server's work on one thread that is always on a core while other
    cores sit idle (nobody else uses them): the model's work is not spread over the machine."""
    if cores < 2 or elapsed_s <= 0 or not threads:
        return None
    busiest = max(threads, key=lambda t: t.cpu_s)
    share = busiest.cpu_s / elapsed_s
    server_cores = sum(t.cpu_s for t in threads) / elapsed_s
    outside = None if others_cores is None else max(0.0, others_cores - server_cores)
    if share < BUSY_THREAD or server_cores > cores - IDLE_CORES or outside is None or outside >= CONTENDED_CORES:
        return None
    return Bottleneck("one busy thread", f"CPU-bound on one thread: '{busiest.name}' was on a core {share:.0%} of "
                      f"the time while the server used {server_cores:.1f} of {cores} cores",
                      [f"/proc: '{busiest.name}' (tid {busiest.tid}) ran {busiest.cpu_s:.2f} s of {elapsed_s:.2f} s; "
                       f"the server's threads together {server_cores * elapsed_s:.2f} s; other processes "
                       f"{outside:.2f} cores"], ["threads"],
                      "more threads for the model's work (--threads, n_threads, OMP_NUM_THREADS)")
