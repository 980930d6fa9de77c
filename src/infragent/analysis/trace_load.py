"""Load traces into TraceColumns: Chrome Trace Event JSON (X, B/E, i, C, M, flows; gzipped or not; object or
array form, the array's closing bracket optional as the format allows), Kineto (torch.profiler) traces, and
our own recorder's Trace. Reading is trace_read.py's, building trace_build.py's; this module picks the path
(in place in two halves, two processes, or one) by the file's size.

Big files are split by msgspec into raw event slices in one pass, then decoded into typed structs a batch
at a time (args stay raw JSON until asked for) and turned into numpy columns, one list comprehension per
field per batch. A malformed or truncated file raises TraceFormatError
naming the file and the byte offset or event index.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import threading
from pathlib import Path

import msgspec

from infragent.analysis import trace_halves
from infragent.analysis.forked import start_in_child
from infragent.analysis.trace_build import ColumnBuilder, columns_from_trace
from infragent.analysis.trace_columns import TraceColumns
from infragent.analysis.trace_read import MAP_ABOVE_BYTES, Region, decode_batch, read_bytes, split_events

__all__ = ["load_columns", "columns_from_trace"]

KEEP_ARGS_BELOW_BYTES = 256 << 20  # past this, args are dropped after loading (they pin the whole file)
PARALLEL_ABOVE = 400_000  # events: past this, a forked child decodes half of the batches
BATCH = 100_000  # events decoded to structs at a time: peak memory is the file, not the file plus its structs


def load_columns(path: str | Path, keep_args: bool | None = None) -> TraceColumns:
    """Read a Chrome/Kineto trace file (.json or .json.gz) into columns."""
    path = Path(path)
    fast = _fast(path, keep_args)
    if fast is not None:
        return fast
    data = read_bytes(path)
    keep = len(data) < KEEP_ARGS_BELOW_BYTES if keep_args is None else keep_args
    raws, meta = split_events(data, str(path))
    builder = ColumnBuilder(str(path), keep)
    if len(raws) >= PARALLEL_ABOVE and not keep and _can_fork():
        _decode_in_two_processes(data, raws, builder)
    else:
        for first in range(0, len(raws), BATCH):
            builder.add(decode_batch(raws[first:first + BATCH], first, str(path)), first)
    del raws
    return builder.finish(meta)


def _fast(path: Path, keep_args: bool | None) -> TraceColumns | None:
    """Big plain files without args kept: two processes decode the two halves in place (trace_halves.py)."""
    try:
        size = path.stat().st_size if path.is_file() else 0
    except OSError:
        return None
    if size < MAP_ABOVE_BYTES or keep_args or not _can_fork():
        return None
    with path.open("rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return None
    data = trace_halves.open_private(str(path))
    cut = trace_halves.halves(data)
    if cut is None:
        return None
    builder = ColumnBuilder(str(path), False)
    if not trace_halves.decode_halves(cut[0], cut[1], builder):
        return None  # the careful path reports what is wrong, with its location
    return builder.finish(cut[2])


def _can_fork() -> bool:
    """Forking is safe only from a single-threaded process on a machine with a second core."""
    return hasattr(os, "fork") and (os.cpu_count() or 1) > 1 and threading.active_count() == 1


def _decode_in_two_processes(data: bytes | mmap.mmap, raws: list[msgspec.Raw], builder: ColumnBuilder) -> None:
    """Decode odd batches in a forked child (it shares the file's memory) and even ones here, then merge.

    Decoding is CPU-bound and holds the GIL, so a second process is the only way to use the second core.
    """
    def decode(builder_: ColumnBuilder, parity: int) -> ColumnBuilder:
        region = Region(data)
        for first in range(parity * BATCH, len(raws), 2 * BATCH):
            batch = raws[first:first + BATCH]
            builder_.add(decode_batch(batch, first, builder.source, lean=True, region=region), first, batch)
        return builder_

    join = start_in_child(lambda: decode(ColumnBuilder(builder.source, False), 1).export())
    try:
        decode(builder, 0)
    except BaseException:
        with contextlib.suppress(Exception):
            join()  # reap the child; our own error is the one to report
        raise
    builder.merge(join())  # or the child's error, with its event's index


