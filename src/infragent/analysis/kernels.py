"""Kernel breakdown: GPU time by kind (GEMM, attention, elementwise/reduction, memory, communication, other),
by source (ATen, Triton, cuBLAS, ...), per stream, and the top kernels by total time. Shares are of the summed
work time (kernels on two streams at once both count); short names for people, full names kept in the data."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.kernel_names import KINDS, kernel_kind, kernel_source, short_name
from infragent.analysis.kineto import stream_name
from infragent.analysis.trace_columns import TraceColumns


@dataclass
class KindRow:
    """GPU time of one kind (or source) of work."""

    kind: str
    total_ns: int
    count: int
    share: float


@dataclass
class KernelRow:
    """One kernel name's calls."""

    name: str  # the full name, as the trace has it
    short: str
    kind: str
    source: str
    count: int
    total_ns: int
    median_ns: float
    share: float


@dataclass
class KernelTable:
    """The breakdown of GPU work time."""

    total_ns: int
    kinds: list[KindRow] = field(default_factory=list)
    sources: list[KindRow] = field(default_factory=list)
    streams: dict[str, list[KindRow]] = field(default_factory=dict)
    top: list[KernelRow] = field(default_factory=list)


def kernel_table(c: TraceColumns, work: np.ndarray, top: int = 10) -> KernelTable:
    """Time by kind, by source and per stream, and the top kernels, over the GPU work rows."""
    rows = np.flatnonzero(work)
    dur = (c.end - c.start)[rows]
    total = int(dur.sum())
    pairs = {(n, k) for n, k in zip(c.name[rows].tolist(), c.cat[rows].tolist())}
    kind_of = {p: kernel_kind(c.names[p[0]], c.cats[p[1]]) for p in pairs}
    source_of = {p: kernel_source(c.names[p[0]], c.cats[p[1]]) for p in pairs}
    keys = list(zip(c.name[rows].tolist(), c.cat[rows].tolist()))
    kinds = np.asarray([kind_of[k] for k in keys], dtype=object)
    sources = np.asarray([source_of[k] for k in keys], dtype=object)
    table = KernelTable(total, _rows(kinds, dur, total, KINDS), _rows(sources, dur, total))
    for t in np.unique(c.track[rows]).tolist():
        on = c.track[rows] == t
        table.streams[stream_name(c, t)] = _rows(kinds[on], dur[on], int(dur[on].sum()), KINDS)
    names = c.name[rows]
    summed = np.bincount(names, weights=dur, minlength=len(c.names))
    for n in np.argsort(-summed)[:top].tolist():
        if summed[n] <= 0:
            break
        mine = names == n
        first = keys[int(np.flatnonzero(mine)[0])]
        table.top.append(KernelRow(c.names[n], short_name(c.names[n]), kind_of[first], source_of[first],
                                   int(mine.sum()), int(summed[n]), float(np.median(dur[mine])),
                                   float(summed[n] / total) if total else 0.0))
    return table


def _rows(labels: np.ndarray, dur: np.ndarray, total: int, order: tuple[str, ...] | None = None) -> list[KindRow]:
    present = sorted(set(labels.tolist()), key=lambda k: order.index(k) if order else 0)
    rows = [KindRow(k, int(dur[labels == k].sum()), int((labels == k).sum()),
                    float(dur[labels == k].sum() / total) if total else 0.0) for k in present]
    return sorted(rows, key=lambda r: -r.total_ns)
