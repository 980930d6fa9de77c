"""A trace as the report shows it: where the time goes (top spans, phases, threads) and a timeline excerpt,
read from the saved trace file itself, plus the file's path for opening it in Perfetto.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infragent.analysis.breakdown import breakdown
from infragent.analysis.trace_columns import TraceColumns
from infragent.analysis.trace_load import load_columns

EXCERPT_SPANS = 400  # spans drawn in the timeline excerpt
EMBED_MAX_BYTES = 1_500_000  # a trace up to this size travels inside the page, so Perfetto can open it offline


@dataclass
class TraceView:
    """One trace's breakdowns and excerpt."""

    path: str  # the saved file (the ledger's copy when there is one)
    label: str  # which trace: the probe record it came from, or the file given
    events: int
    top_spans: list[dict[str, Any]] = field(default_factory=list)  # key, inclusive/exclusive ns, count, share
    by_phase: list[dict[str, Any]] = field(default_factory=list)
    by_track: list[dict[str, Any]] = field(default_factory=list)
    excerpt: list[dict[str, Any]] = field(default_factory=list)  # thread, name, start_ms, dur_ms, depth
    excerpt_ms: float = 0.0
    embedded: bool = False  # whether the page carries the file's bytes
    stored: bool = False  # whether path is the ledger's content-addressed copy (named by its sha256)


def trace_view(path: str | Path, label: str, top: int = 12, spans: int = EXCERPT_SPANS,
               stored: bool = False) -> TraceView:
    """Read the trace at path (our Chrome JSON, Kineto, gzip or not) into what the report draws."""
    c = load_columns(path)
    view = TraceView(str(path), label, len(c), [asdict(r) for r in breakdown(c, "name", top=top)],
                     [asdict(r) for r in breakdown(c, "phase")], [asdict(r) for r in breakdown(c, "track")])
    view.excerpt, view.excerpt_ms = excerpt(c, spans)
    view.embedded = Path(path).stat().st_size <= EMBED_MAX_BYTES
    view.stored = stored
    return view


def excerpt(c: TraceColumns, spans: int) -> tuple[list[dict[str, Any]], float]:
    """The first spans (outer levels first) from the start of the trace, on every thread, and the window's
    length in ms: a stretch of real time, not a sample scattered over the whole run."""
    if not len(c):
        return [], 0.0
    shallow = np.flatnonzero(c.depth <= 2)
    order = shallow[np.argsort(c.start[shallow], kind="stable")][:spans]
    origin = int(c.start[order].min())
    window = float(max(int(c.end[order].max()) - origin, 1)) / 1e6
    rows = [{"thread": c.tracks[int(c.track[i])].name or c.track_label(int(c.track[i])), "name": c.names[int(c.name[i])],
             "start_ms": (int(c.start[i]) - origin) / 1e6, "dur_ms": int(c.end[i] - c.start[i]) / 1e6,
             "depth": int(c.depth[i])} for i in order]
    return rows, window
