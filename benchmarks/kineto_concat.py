"""A Kineto (torch.profiler) trace made K times longer: its events repeated K times, copy k shifted in time by
k x (the trace's span + a small gap), so the copies follow each other without overlapping, as if the
profiled program had run K times as long.

- span: from the earliest event's ts to the latest event's end (ts + dur), over every timed event
  (X, flows, instants, counters; not the 'M' metadata, which is written once, first);
- ids that must stay unique are offset per copy, the same offset for the same kind of id in every copy:
  `correlation` in args (cuda_runtime, cuda_driver, kernel, gpu_memcpy, gpu_memset) and the `id` of flow
  events (ph s/t/f; Kineto's ac2g flow id is the correlation id, so both get the same offset and stay equal);
  `External id` (cpu_op <-> launch <-> kernel), `Python id` / `Python parent id` get their own offsets;
- timestamps keep Kineto's ns precision (floats in µs rounded to 3 decimals after the shift);
- the other top-level fields (deviceProperties, distributedInfo, baseTimeNanoseconds, ...) are kept as they
  are. The output is gzip-written when its name ends in .gz.

What stays exactly the same per copy: every kernel, copy and memset's duration and the overlaps inside a
copy; so compute and non-compute GPU time are exactly K times the original's. The idle time grows by the
stretches between copies (the span around the GPU window, plus the gap), so the idle share is not invariant:
expected(idle_K) = K x idle_1 + (K - 1) x (shift - window_1) with shift = span + gap.

    PYTHONPATH=src .venv/bin/python benchmarks/kineto_concat.py tests/data/h200/llama8_prefill_sidecopy.json.gz \
        /tmp/llama8_x10.json.gz --times 10 [--gap-us 10]
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path
from typing import Any

FLOW = ("s", "t", "f")
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id")


def _read(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return {"traceEvents": data} if isinstance(data, list) else data


def _offsets(events: list[dict]) -> dict[str, int]:
    """Per kind of id, the step between copies: a round number above the largest id of that kind."""
    largest = {"flow": 0, **{k: 0 for k in ID_ARGS}}
    for e in events:
        args = e.get("args") or {}
        for k in ID_ARGS:
            if isinstance(args.get(k), int):
                largest[k] = max(largest[k], args[k])
        if e.get("ph") in FLOW and isinstance(e.get("id"), int):
            largest["flow"] = max(largest["flow"], e["id"])
    largest["flow"] = largest["correlation"] = max(largest["flow"], largest["correlation"])  # ac2g id = correlation
    return {k: 10 ** (len(str(v)) + 1) if v else 0 for k, v in largest.items()}  # e.g. 19937 -> 1_000_000


def span_us(events: list[dict]) -> tuple[float, float]:
    """(first ts, last end) over the timed events, µs."""
    first, last = math.inf, -math.inf
    for e in events:
        if e.get("ph") == "M" or not isinstance(e.get("ts"), (int, float)):
            continue
        first = min(first, e["ts"])
        last = max(last, e["ts"] + (e.get("dur") or 0))
    return first, last


def _shifted(e: dict, k: int, shift: float, step: dict[str, int]) -> dict:
    e = dict(e)
    if k == 0:
        return e
    ts = e["ts"] + k * shift
    e["ts"] = ts if isinstance(ts, int) else round(ts, 3)
    if e.get("ph") in FLOW and isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * step["flow"]
    if isinstance(e.get("args"), dict):
        args = dict(e["args"])
        for name in ID_ARGS:
            if isinstance(args.get(name), int) and args[name] > 0:  # 0 / -1 mean "none" in Kineto: left as is
                args[name] += k * step[name]
        e["args"] = args
    return e


def concat(src: str | Path, out: str | Path, times: int = 10, gap_us: float = 10.0) -> dict[str, Any]:
    """Write `times` shifted copies of src's events to out; return what was done (span, shift, counts)."""
    src, out = Path(src), Path(out)
    data = _read(src)
    events = data["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    untimed = [e for e in events if e.get("ph") != "M" and not isinstance(e.get("ts"), (int, float))]
    first, last = span_us(timed)
    shift = float(math.ceil(last - first + gap_us))  # whole µs: shifted float timestamps keep 3 decimals
    step = _offsets(events)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in data.items() if k != "traceEvents"}
    opener = gzip.open if out.name.endswith(".gz") else open
    n = 0
    with opener(out, "wt") as f:
        f.write("{\n")
        for key, value in head.items():
            f.write(f"{json.dumps(key)}: {json.dumps(value)},\n")
        f.write('"traceEvents": [\n')
        for e in meta + untimed:
            f.write(("" if n == 0 else ",\n") + json.dumps(e))
            n += 1
        for k in range(times):
            for e in timed:
                f.write(("" if n == 0 else ",\n") + json.dumps(_shifted(e, k, shift, step)))
                n += 1
        f.write("\n]}\n")
    return {"source": str(src), "out": str(out), "times": times, "gap_us": gap_us, "span_us": last - first,
            "shift_us": shift, "events_in": len(events), "events_out": n, "id_steps": step,
            "bytes_out": out.stat().st_size}


def main() -> None:
    """Write a K times longer trace."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--gap-us", type=float, default=10.0)
    args = parser.parse_args()
    info = concat(args.src, args.out, args.times, args.gap_us)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
