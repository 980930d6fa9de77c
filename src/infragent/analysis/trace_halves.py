"""The fast path for big trace files: two processes each decode half of the traceEvents array straight
from the memory-mapped file, with no splitting pass and no copy.

The array is cut at an event boundary near its middle: a comma followed by whitespace between two events.
In a private (copy-on-write) mapping that comma becomes `]` and the whitespace `[`, so each half is a
complete JSON array in place. Events decode into a tagged union on "ph" whose members carry only the
fields their phase needs (no args for complete events). Any surprise (no boundary found, an unknown
phase, a bad value) returns None and the caller takes the careful path, whose errors name the byte or
event; a cut in the wrong place cannot pass, because then one half is not valid JSON.
"""
from __future__ import annotations

import mmap
import re
from typing import Any, ClassVar, Union

import msgspec

from infragent.analysis.forked import start_in_child
from infragent.analysis.trace_read import file_meta

NAN = float("nan")
_RAW = msgspec.Raw(b"{}")


class _X(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    ph: ClassVar[str] = "X"
    name: str = ""
    cat: str = ""
    ts: float = NAN
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0


def _instant(tag: str) -> type:
    return msgspec.defstruct(f"_I{ord(tag)}", [("name", str, ""), ("cat", str, ""), ("ts", float, NAN),
                                               ("dur", float, 0.0), ("pid", Union[int, str], 0),
                                               ("tid", Union[int, str], 0), ("ph", ClassVar[str], tag)],
                             tag_field="ph", tag=tag, gc=False, module=__name__)


def _full(tag: str) -> type:
    """Rare phases (B/E, C, M, flows): every field the careful path reads."""
    return msgspec.defstruct(f"_F{ord(tag)}", [("name", str, ""), ("cat", str, ""), ("ts", float, NAN),
                                               ("dur", float, 0.0), ("pid", Union[int, str], 0),
                                               ("tid", Union[int, str], 0), ("id", Union[int, str, None], None),
                                               ("bp", Union[str, None], None), ("args", msgspec.Raw, _RAW),
                                               ("ph", ClassVar[str], tag)],
                             tag_field="ph", tag=tag, gc=False, module=__name__)


def _ignored(tag: str) -> type:
    return msgspec.defstruct(f"_O{ord(tag)}", [("ph", ClassVar[str], "")], tag_field="ph", tag=tag, gc=False,
                             module=__name__)


INSTANT, RARE, IGNORED = "iInR", "BECMstf", "beNODPSTpFv()"  # Chrome trace phases by how they are kept
_MEMBERS = (_X, *map(_instant, INSTANT), *map(_full, RARE), *map(_ignored, IGNORED))
globals().update({cls.__name__: cls for cls in _MEMBERS})  # the child pickles rare events back: make them importable
_EVENT = Union[_MEMBERS]  # type: ignore[valid-type]
_DECODER = msgspec.json.Decoder(list[_EVENT])
_CUT = re.compile(rb"\},(\s)\s*\{")


class _Frame(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]
    otherData: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    deviceProperties: list[Any] | None = None
    distributedInfo: dict[str, Any] | None = None


def open_private(path: str) -> mmap.mmap:
    """A copy-on-write mapping of the file (writes stay in this process and its children)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def halves(data: mmap.mmap) -> tuple[memoryview, memoryview, dict[str, Any]] | None:
    """Cut the traceEvents array into two in-place JSON arrays; also the file's metadata. None: no clean cut."""
    start, end, meta = _frame(data)
    if start is None:
        return None
    for match in _CUT.finditer(data, (start + end) // 2, end):
        comma = match.start() + 1
        data[comma] = ord("]")
        data[comma + 1] = ord("[")
        view = memoryview(data)
        return view[start:comma + 1], view[comma + 1:end + 1], meta
    return None


def _frame(data: mmap.mmap) -> tuple[int | None, int, dict[str, Any]]:
    """Where the traceEvents array starts and ends, and the metadata around it, checked by decoding the
    file with the array emptied out."""
    key = data.find(b'"traceEvents"', 0, 1 << 20)
    if key < 0:
        return None, 0, {}
    start = data.find(b"[", key)
    if start < 0 or data[key + 13:start].strip(b" \t\r\n:") != b"":
        return None, 0, {}
    tail_from = max(start, len(data) - (1 << 16))
    close = data.rfind(b"]", tail_from)
    while close > start:
        try:
            frame = msgspec.json.decode(data[:start + 1] + data[close:], type=_Frame)
        except msgspec.DecodeError:
            close = data.rfind(b"]", tail_from, close)
            continue
        return start, close, file_meta(frame)
    return None, 0, {}


def decode_halves(first: memoryview, second: memoryview, builder: Any) -> bool:
    """Decode the second half in a forked child and the first here, into builder. False: take the careful path."""
    def second_half() -> tuple:
        mine = type(builder)(builder.source, False)
        mine.add(_DECODER.decode(second), 1 << 40)  # ordered after the first half's rows
        return mine.export()

    join = start_in_child(second_half)
    ok = True
    try:
        builder.add(_DECODER.decode(first), 0)
    except (msgspec.DecodeError, ValueError):
        ok = False
    try:
        other = join()
    except Exception:  # noqa: BLE001 - any failure in the child sends the caller to the careful path
        return False
    if not ok:
        return False
    builder.merge(other)
    return True
