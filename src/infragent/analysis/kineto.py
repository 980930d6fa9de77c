"""Kineto (torch.profiler) semantics over TraceColumns: which events are GPU work, which are host activity,
which are bookkeeping, on which device each stream is, and which host call launched each piece of GPU work.

Categories, as Kineto writes them:
- GPU work: `kernel`, `gpu_memcpy`, `gpu_memset` (on pid = device, tid = stream);
- not work: `gpu_user_annotation` (the GPU-side copy of a `record_function` range), `ac2g` flows (launch →
  kernel arrows), `Trace` and `overhead` (the profiler's own bookkeeping, dropped when loading);
- host: `cpu_op`, `cuda_runtime`, `cuda_driver`, `python_function`, `user_annotation`.
A launch is tied to its GPU work by the `correlation` arg both carry (a CUDA-graph launch is the correlation of
every kernel the replay runs); without args, by the `ac2g` flows.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from infragent.analysis.trace_columns import TraceColumns

DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
DEVICE_COPY = frozenset({"gpu_memcpy", "gpu_memset"})
NOT_WORK = frozenset({"gpu_user_annotation", "ac2g"})
BOOKKEEPING = frozenset({"Trace", "overhead"})  # dropped when loading: they are the profiler's, not the program's
HOST_CALLS = frozenset({"cuda_runtime", "cuda_driver"})
HOST_CODE = frozenset({"cpu_op", "python_function"})
SYNC_CALL = re.compile(r"(cuda|cu|hip)(Device|Stream|Event|Ctx)Synchronize|(cuda|cu|hip)StreamWaitEvent"
                       r"|^(cuda|hip)Memcpy$|^cuMemcpy(HtoD|DtoH|DtoD)?(_v2)?$|(cuda|hip)(Stream|Event)Query")
GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)")


def category_mask(c: TraceColumns, categories: frozenset[str]) -> np.ndarray:
    """Events whose category is one of categories."""
    return np.isin(c.cat, np.asarray([i for i, s in enumerate(c.cats) if s in categories], np.int32))


def device_work(c: TraceColumns) -> np.ndarray:
    """Mask of GPU work: kernels, memcpy and memset on stream tracks (annotations are not work)."""
    streams = np.asarray([t.kind == "stream" for t in c.tracks] or [False])
    on_stream = streams[c.track] if len(c) else np.zeros(0, bool)
    if not any(s in DEVICE_WORK for s in c.cats):  # a GPU trace without Kineto's categories: everything on streams
        return on_stream & ~category_mask(c, NOT_WORK)
    return on_stream & category_mask(c, DEVICE_WORK)


def device_of(c: TraceColumns) -> np.ndarray:
    """Per track, the device index of a stream (Kineto's pid for GPU rows), -1 for host threads."""
    return np.asarray([t.pid if t.kind == "stream" else -1 for t in c.tracks] or [-1], np.int64)


def stream_name(c: TraceColumns, track: int) -> str:
    """'stream 7' (with the device when the trace has several)."""
    t = c.tracks[track]
    devices = {x.pid for x in c.tracks if x.kind == "stream"}
    return f"stream {t.tid}" + (f" (GPU {t.pid})" if len(devices) > 1 else "")


@dataclass
class Launches:
    """Launch ↔ work correlation: per event row, the host call that launched it (-1 when unknown)."""

    launch: np.ndarray  # per row: the launching cuda_runtime/cuda_driver row, or -1
    graph: np.ndarray  # per row: bool, launched by a CUDA-graph launch

    def launched(self, mask: np.ndarray) -> np.ndarray:
        """Mask of selected rows whose launch is known."""
        return mask & (self.launch >= 0)


def launches(c: TraceColumns, work: np.ndarray | None = None) -> Launches:
    """Which host call launched each GPU work row: by the `correlation` arg, else by ac2g flows."""
    work = device_work(c) if work is None else work
    launch = np.full(len(c), -1, np.int64)
    calls = category_mask(c, HOST_CALLS)
    if c.args is not None:
        launch[work] = _by_correlation(c, np.flatnonzero(calls), np.flatnonzero(work))
    if (launch[work] < 0).any() and c.flows.size:
        src, dst = c.flows[:, 0], c.flows[:, 1]
        ok = calls[src] & work[dst] & (launch[dst] < 0)
        launch[dst[ok]] = src[ok]
    graph_names = np.asarray([bool(GRAPH_LAUNCH.match(s)) for s in c.names] or [False])
    graph = np.zeros(len(c), bool)
    known = launch >= 0
    graph[known] = graph_names[c.name[launch[known]]]
    return Launches(launch, graph)


class _Correlated(msgspec.Struct):
    correlation: Any = None


_CORRELATIONS = msgspec.json.Decoder(list[_Correlated])


def _correlation_ids(c: TraceColumns, rows: np.ndarray) -> np.ndarray:
    """The correlation id in each row's args (-1 where there is none, or none that fits an int64).

    Raw args are decoded in one call, reading only that field; a batch with an odd one goes row by row."""
    raws = [c.args[r] for r in rows.tolist()] if c.args is not None else []
    values: list[Any]
    if raws and all(isinstance(v, msgspec.Raw) for v in raws):
        try:
            values = [x.correlation for x in _CORRELATIONS.decode(b"[" + b",".join(raws) + b"]")]
        except (msgspec.DecodeError, msgspec.ValidationError):
            values = [c.attrs(r).get("correlation") for r in rows.tolist()]
    else:
        values = [c.attrs(r).get("correlation") for r in rows.tolist()]
    return np.asarray([v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 else -1
                       for v in values], np.int64).reshape(-1)


def _by_correlation(c: TraceColumns, calls: np.ndarray, work: np.ndarray) -> np.ndarray:
    """For each work row, the call row with the same correlation id (-1 when none)."""
    ids = functools.partial(_correlation_ids, c)
    call_ids, work_ids = ids(calls), ids(work)
    have = call_ids >= 0
    call_ids, calls = call_ids[have], calls[have]
    order = np.argsort(call_ids, kind="stable")
    call_ids, calls = call_ids[order], calls[order]
    at = np.searchsorted(call_ids, work_ids)
    at_ok = np.minimum(at, max(call_ids.size - 1, 0))
    found = (work_ids >= 0) & (at < call_ids.size) & (call_ids[at_ok] == work_ids) if call_ids.size else \
        np.zeros(work_ids.size, bool)
    return np.where(found, calls[at_ok] if call_ids.size else -1, -1)
