"""Reading a trace file: its bytes (memory-mapped when big, decompressed when gzipped), the events as raw JSON
slices in one pass, and typed events a batch at a time. A malformed or truncated file raises TraceFormatError
naming the file and the byte offset or the event's index in the whole trace."""
from __future__ import annotations

import gzip
import mmap
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from infragent.trace_model import TraceFormatError

MAP_ABOVE_BYTES = 64 << 20  # files this big are memory-mapped rather than read into a bytes object
_NAN = float("nan")
NO_ARGS = msgspec.Raw(b"{}")


class LeanEvent(msgspec.Struct, gc=False):
    """The fields spans need; big traces decode these only (rare event types are decoded again in full)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = _NAN
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0


class TraceEvent(LeanEvent, gc=False):
    """Every field any event type needs: flows' id and binding point, counters' and names' args."""

    id: int | str | None = None
    bp: str | None = None
    args: msgspec.Raw = NO_ARGS


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]
    otherData: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None
    deviceProperties: list[Any] | None = None  # Kineto: one object per GPU (name, SMs, memory)
    distributedInfo: dict[str, Any] | None = None  # Kineto: rank and world size of a distributed run


def read_bytes(path: Path) -> bytes | mmap.mmap:
    """The file's bytes: memory-mapped when big and not gzipped (no copy), decompressed when gzipped."""
    try:
        if path.is_file() and path.stat().st_size >= MAP_ABOVE_BYTES:
            with path.open("rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if mapped[:2] != b"\x1f\x8b":
                return mapped
            mapped.close()
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory; give one trace file") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise TraceFormatError(f"{path}: broken gzip data: {_gzip_break(raw) or err}; re-export or re-copy "
                               "the file") from None


def _gzip_break(raw: bytes, step: int = 1 << 14) -> str | None:
    """Where and how gzip data breaks, by its byte offset in the compressed file (None when it does not):
    decompressed again a chunk at a time, then byte by byte from the last good chunk's state."""
    at = 0
    while at < len(raw):
        member, pos = zlib.decompressobj(31), at
        while pos < len(raw) and not member.eof:
            saved = member.copy()
            try:
                member.decompress(raw[pos:pos + step])
            except zlib.error as err:
                for k in range(pos, min(pos + step, len(raw))):
                    try:
                        saved.decompress(raw[k:k + 1])
                    except zlib.error:
                        if k >= len(raw) - 8:  # the trailer: CRC-32 and length of the data
                            return (f"the checksum at byte {k} of {len(raw)} does not match the data: bytes were "
                                    "altered")
                        return f"corrupt at byte {k} of {len(raw)} ({str(err).split(': ')[-1]})"
                return f"corrupt at bytes {pos}-{min(pos + step, len(raw))} of {len(raw)} ({err})"
            pos += step
        if not member.eof:
            return (f"truncated: the compressed data ends at byte {len(raw)} before the end of its gzip stream "
                    "(was the copy or the export cut short?)")
        at = min(pos, len(raw)) - len(member.unused_data)
        if at < len(raw) and raw[at:at + 2] != b"\x1f\x8b":
            return f"bytes {at}-{len(raw)} after the end of the gzip stream are not gzip data"
    return None


def split_events(data: bytes, source: str) -> tuple[list[msgspec.Raw], dict[str, Any]]:
    """The events as raw JSON slices (one fast pass that also checks the syntax), and the file's metadata."""
    start = bytes(data[:4096]).lstrip()[:1]
    if start not in (b"{", b"["):
        raise TraceFormatError(f"{source}: not a Chrome trace: byte 0 should open a JSON object or array "
                               f"(found {data[:16]!r})")
    try:
        if start == b"[":
            return _split_array(data), {}
        file = msgspec.json.decode(data, type=TraceFile)
    except msgspec.ValidationError as err:
        if str(err).startswith("Object missing required field `traceEvents`"):
            raise TraceFormatError(f"{source}: traceEvents: missing; a Chrome trace object holds its events in a "
                                   "'traceEvents' list") from None
        raise TraceFormatError(f"{source}: {_where(str(err))}") from None
    except msgspec.DecodeError as err:
        raise TraceFormatError(f"{source}: {_decode_message(err, data)}") from None
    return file.traceEvents, file_meta(file)


def file_meta(file: Any) -> dict[str, Any]:
    """The metadata around the events: otherData, and Kineto's clock base, GPUs and distributed rank."""
    meta = dict(file.otherData or {})
    for key in ("baseTimeNanoseconds", "deviceProperties", "distributedInfo"):
        if getattr(file, key, None) is not None:
            meta[key] = getattr(file, key)
    return meta


def _split_array(data: bytes) -> list[msgspec.Raw]:
    """The JSON Array Format; its closing ']' may be missing (the format allows it), and a trailing comma too."""
    try:
        return msgspec.json.decode(data, type=list[msgspec.Raw])
    except msgspec.DecodeError as err:
        body = bytes(data).rstrip()
        if not str(err).startswith("Input data was truncated") or body.endswith(b"]"):
            raise
        try:
            return msgspec.json.decode(body.rstrip(b",") + b"]", type=list[msgspec.Raw])
        except msgspec.DecodeError:
            raise err from None


_FULL = msgspec.json.Decoder(list[TraceEvent])
_LEAN = msgspec.json.Decoder(list[LeanEvent])
ONE_EVENT = msgspec.json.Decoder(TraceEvent)
_ONE_LEAN = msgspec.json.Decoder(LeanEvent)


def decode_batch(raws: list[msgspec.Raw], first: int, source: str, lean: bool = False,
                  region: "Region | None" = None) -> list[TraceEvent]:
    """Typed events of one batch (lean: span fields only); a bad field is reported at its trace-wide index."""
    try:
        text = region.around(raws) if region is not None and lean else b"[" + b",".join(raws) + b"]"
        events = (_LEAN if lean else _FULL).decode(text)
    except msgspec.ValidationError as err:
        where = _where(str(err))
        index, _, rest = where.removeprefix("[").partition("]")
        if index.isdigit():
            where = f"traceEvents[{first + int(index)}]{rest}"
        raise TraceFormatError(f"{source}: {where}") from None
    except msgspec.DecodeError as err:  # invalid UTF-8 in a string: the splitting pass checks syntax, not text
        decoder = _ONE_LEAN if lean else ONE_EVENT
        for k, raw in enumerate(raws):
            try:
                decoder.decode(raw)
            except msgspec.DecodeError:
                raise TraceFormatError(f"{source}: traceEvents[{first + k}]: {err}") from None
        raise TraceFormatError(f"{source}: traceEvents[{first}] to [{first + len(raws) - 1}]: {err}") from None
    if not lean and not text.isascii():
        _check_text(raws, first, source, text)
    return events


def _check_text(raws: list[msgspec.Raw], first: int, source: str, text: bytes) -> None:
    """Args stay raw JSON until asked for, so their strings are checked here: valid UTF-8 (one fast pass over
    the batch; event by event only to say which one is not)."""
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        for k, raw in enumerate(raws):
            try:
                bytes(raw).decode("utf-8")
            except UnicodeDecodeError as err:
                raise TraceFormatError(f"{source}: traceEvents[{first + k}]: invalid UTF-8 at byte {err.start} "
                                       f"of the event ({bytes(raw)[err.start:err.start + 4]!r})") from None


class Region:
    """Batches as one copy of their byte range in the file, into a reused buffer (lean decoding keeps no
    reference into it): no per-event join, no fresh multi-MB allocation per batch."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self.view = memoryview(data)
        self.base = np.frombuffer(data, np.uint8).ctypes.data
        self.buffer = bytearray()

    def offset(self, raw: msgspec.Raw) -> int:
        return np.frombuffer(raw, np.uint8).ctypes.data - self.base

    def around(self, raws: list[msgspec.Raw]) -> memoryview:
        """'[' + the bytes from the first raw's start to the last raw's end + ']'."""
        lo, hi = self.offset(raws[0]), self.offset(raws[-1]) + len(raws[-1])
        if not 0 <= lo < hi <= len(self.view):  # not slices of this buffer after all
            return memoryview(b"[" + b",".join(raws) + b"]")
        size = hi - lo + 2
        if len(self.buffer) < size:
            self.buffer = bytearray(size + (size >> 3))
        self.buffer[0] = 0x5B  # [
        self.buffer[1:size - 1] = self.view[lo:hi]
        self.buffer[size - 1] = 0x5D  # ]
        return memoryview(self.buffer)[:size]


def _decode_message(err: msgspec.DecodeError, data: bytes) -> str:
    text = str(err)
    if text.startswith("Input data was truncated"):
        return (f"truncated JSON: the file ends at byte {len(data)} in the middle of the trace "
                "(was the profiler stopped before it finished writing?)")
    if text.startswith("Invalid UTF-8"):  # msgspec does not say where: the first bad byte is the place
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            return f"malformed JSON: invalid UTF-8 at byte {err.start} ({bytes(data[err.start:err.start + 4])!r})"
    return f"malformed JSON: {text}"


def _where(message: str) -> str:
    """msgspec's `... - at `$.traceEvents[12].ts`` as `traceEvents[12].ts: ...`."""
    what, _, at = message.partition(" - at `")
    return f"{at.rstrip('`').removeprefix('$.').removeprefix('$')}: {what}" if at else message
