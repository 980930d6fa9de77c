"""`infragent diagnose --base-url URL`: what limits a running serving stack, seen from outside.

A short load of fresh prompts (loadgen) runs against the server. Meanwhile its /metrics are read (whichever
known family it exposes), its threads are sampled (/proc: any process), its Python stacks are sampled
(py-spy, where the server is Python and ptrace is allowed), and a profile is taken where the server offers
/start_profile and /stop_profile. The rules in server_findings.py turn that into bottlenecks, each with its
evidence and the kinds of knobs that act on it. What could not be seen is said, never guessed.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import psutil

from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.machine import CpuWatch
from infragent.probes.loadgen import LoadConfig, LoadRun, discover_model, fresh_seed, prompt_format, run_once
from infragent.probes.processes import NotTheServer, alive, describe, server_processes
from infragent.probes.server_findings import (Bottleneck, cut_short, hot_function, kv_capacity, launch_limit,
                                              one_busy_thread, prefill_interference, queueing, refused, serialized,
                                              starved, tokenization)
from infragent.probes.server_metrics import MetricsSeries, MetricsWatch
from infragent.probes.server_profile import ServerProfile
from infragent.probes.server_stacks import StackSampling, finish_pyspy, start_pyspy
from infragent.probes.server_threads import ThreadReading, ThreadWatch


@dataclass
class DiagnoseConfig:
    """Where the server is, which of its processes to read, and the load to drive."""

    base_url: str
    pid: int | None = None
    pgid: int | None = None
    profile_dir: str | None = None
    seconds: float = 15.0
    concurrency: int = 16
    input_len: int = 256
    output_len: int = 64
    endpoint: str = "/v1/completions"
    model: str | None = None
    api_key: str | None = None
    pyspy: bool = True
    prompt_format: str = "text"  # as real clients send them (token ids would skip the server's tokenizer)


PROFILE_S = 2.0  # of load under the profiler: a trace of every op for this long is MBs already


class DiagnoseError(RuntimeError):
    """Bad input: one line saying what is wrong and what to do."""


@dataclass
class Observed:
    """What one watched load saw of the server."""

    run: LoadRun
    series: MetricsSeries
    readings: list[ThreadReading]
    elapsed_s: float
    others_cores: float | None  # CPU every process but this one used meanwhile (the server's included)
    sampling: StackSampling | None
    blind: list[str]


def run_diagnose(config: DiagnoseConfig) -> Feedback:
    """Drive the load, read the server meanwhile, and answer with its bottlenecks and what could not be seen."""
    started = time.monotonic()
    load = LoadConfig(config.base_url, model=config.model, endpoint=config.endpoint,
                      num_prompts=max(64, config.concurrency * 40), max_concurrency=config.concurrency,
                      random_input_len=config.input_len, random_output_len=config.output_len, warmup=1,
                      api_key=config.api_key, progress=False, seed=fresh_seed(), prompt_format=config.prompt_format)
    model = _reachable(load)
    try:
        pids = server_processes(config.base_url, config.pid, config.pgid)
    except NotTheServer as err:
        raise DiagnoseError(str(err)) from None
    fmt, why, _ = prompt_format(load, model)
    load = replace(load, prompt_format=fmt)
    try:
        seen = _observe(config, load, model, pids)
    except OSError as err:  # connection refused or reset: the server went away under the load
        gone = [pid for pid in pids if not alive(pid)]
        state = f"; its process {gone[0]} is gone (it crashed or was stopped: see its log)" if gone else ""
        raise DiagnoseError(f"--base-url {config.base_url}: the server stopped answering during the load "
                            f"({type(err).__name__}: {err}){state}") from None
    profile = ServerProfile(config.base_url, config.profile_dir, config.api_key)
    profile.start()  # after the measured load: a profiler's own cost (its export stalls a server) stays out of it
    if profile.active:
        asyncio.run(run_once(load, model, load.seed + 1, PROFILE_S))
        profile.stop()
    seen.blind.extend(profile.notes)
    found = _bottlenecks(seen, launch_limit(_cmdline(pids)), config.concurrency)
    return _feedback(config, model, f"{fmt}: {why}", seen, found, pids, profile, time.monotonic() - started)


def _observe(config: DiagnoseConfig, load: LoadConfig, model: str, pids: list[int]) -> Observed:
    """The load run while the server's metrics, threads and (py-spy) stacks are read."""
    blind = [] if pids else [f"the server's processes ({config.base_url} is not on this machine, or its listener "
                             "is not visible to this user; pass --pid): no thread states or stacks"]
    out = Path(tempfile.mkdtemp(prefix="infragent-diagnose-")) / "pyspy.json"
    spy, note = (None, None) if not (config.pyspy and pids) else start_pyspy(pids[0], config.seconds, out)
    if pids and not config.pyspy:
        note = "Python stacks (py-spy was turned off)"
    cpu = CpuWatch()
    with MetricsWatch(config.base_url, config.api_key) as watch, ThreadWatch(pids) as threads:
        run = asyncio.run(run_once(load, model, load.seed, config.seconds))
    others = cpu.others_cores()
    sampling = finish_pyspy(spy, out, pids[0]) if spy is not None else None
    blind += [n for n in (note, sampling.note if sampling else None) if n]
    if watch.series.missing and not watch.series.scrapes:
        blind.append(watch.series.missing)
    readings = threads.readings()
    named = {t.tid: t.name for t in (sampling.threads if sampling else []) if t.name}
    for reading in readings:  # the kernel knows Python threads by the process's name; py-spy by theirs
        reading.name = named.get(reading.tid, reading.name)
    return Observed(run, watch.series, readings, threads.elapsed_s, others, sampling, blind)


def _reachable(load: LoadConfig) -> str:
    try:
        httpx.get(f"{load.base_url.rstrip('/')}/v1/models", timeout=10.0,
                  headers={"Authorization": f"Bearer {load.api_key}"} if load.api_key else {})
    except httpx.HTTPError as err:
        raise DiagnoseError(f"--base-url {load.base_url}: nothing answers ({type(err).__name__}: {err}); start the "
                            "server or fix the URL") from None
    try:
        return discover_model(load)
    except ConnectionError as err:
        raise DiagnoseError(str(err)) from None


def _cmdline(pids: list[int]) -> list[str]:
    for pid in pids:
        try:
            return psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
    return []


def _bottlenecks(seen: Observed, limit: tuple[str, int] | None, offered: int) -> list[Bottleneck]:
    series, sampling, records = seen.series, seen.sampling, seen.run.records
    cores = os.cpu_count() or 1
    tokenizing = tokenization(sampling, sum(r.success and not r.warmup for r in records))
    rules = [queueing(series, limit, offered) if series.scrapes else None,
             kv_capacity(series) if series.scrapes else None,
             serialized(records, offered), cut_short(records), refused(records), prefill_interference(records),
             tokenizing,
             starved(seen.readings, cores, seen.elapsed_s, seen.others_cores),
             one_busy_thread(seen.readings, cores, seen.elapsed_s, seen.others_cores),
             hot_function(sampling, skip_tokenization=tokenizing is not None)]
    return [b for b in rules if b is not None]


def _feedback(config: DiagnoseConfig, model: str, prompts: str, seen: Observed, found: list[Bottleneck],
              pids: list[int], profile: ServerProfile, wall_s: float) -> Feedback:
    run, series, sampling, readings, blind = seen.run, seen.series, seen.sampling, seen.readings, seen.blind
    m = run.metrics
    numbers = {"output_throughput": Measure(m.output_throughput, "tok/s", n=m.completed),
               "ttft_median_ms": Measure(m.ttft_ms.median, "ms"), "tpot_median_ms": Measure(m.tpot_ms.median, "ms"),
               "itl_p99_ms": Measure(m.itl_ms.p99, "ms")}
    failed = [r for r in run.records if not r.success and not r.warmup]
    load_line = (f"{m.completed} requests at concurrency {config.concurrency} in {m.duration_s:.1f}s: "
                 f"{m.output_throughput:.1f} output tok/s, TTFT median {m.ttft_ms.median:.0f} ms, "
                 f"TPOT median {m.tpot_ms.median:.1f} ms")
    if failed and not m.completed:
        verdict, finding = "fail", f"every request failed ({len(failed)}): {failed[0].error}"
    elif found:
        verdict = "pass"
        finding = "; ".join(b.claim for b in found) + f" ({load_line})"
    else:
        verdict = "inconclusive"
        finding = f"no bottleneck stood out ({load_line})"
    if failed and m.completed:
        finding += f"; {len(failed)} requests failed ({failed[0].error})"
    gone = [pid for pid in pids if not alive(pid)]
    if gone:  # what the rules read was cut short: say first that the server went away
        verdict, finding = "fail", (f"the server went away during the load: its process {gone[0]} is gone (it "
                                    f"crashed or was stopped: see its log); {finding}")
    if profile.reading:
        finding += f"; its profile: {profile.reading['headline']}"
    if blind:
        finding += "; could not see: " + "; ".join(blind)
    result = {"config": asdict(config), "model": model, "prompts": prompts, "pids": pids,
              "bottlenecks": [b.to_dict() for b in found], "could_not_see": blind,
              "metrics": series.to_dict(), "threads": [r.to_dict() for r in readings[:40]],
              "stacks": [t.to_dict() for t in (sampling.threads if sampling else [])[:20]],
              "profile": profile.to_dict(),
              "load": {"duration_s": run.duration_s, "metrics": asdict(m),
                       "records": [asdict(r) for r in run.records]}}
    evidence = save_json("diagnose", result, "the server's metrics series, threads, stacks, load records, bottlenecks")
    next_probes = [f"optimize with a knob that acts on {', '.join(b.acts_on)} ({b.fix})" for b in found if b.acts_on]
    if profile.traces:
        next_probes.append(f"infragent analyze {profile.traces[0]}")
    return Feedback("diagnose", verdict, finding, numbers=numbers,
                    locality={"base_url": config.base_url, "model": model,
                              "server": describe(pids[0]) if pids else "not on this machine",
                              "metrics": series.family or "none", "stacks": "py-spy" if sampling and sampling.total()
                              else "none", "wall_s": round(wall_s, 1)},
                    evidence=[evidence], next_probes=next_probes,
                    details={"bottlenecks": [b.to_dict() for b in found], "could_not_see": blind,
                             "profile": profile.to_dict()})
