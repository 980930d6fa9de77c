"""Fuzzing the trace loader and `analyze` with 200 mutated real Kineto traces (H200, tests/data/h200): truncated,
empty, malformed, mistyped or inconsistent files must either be analyzed (any verdict) or fail with one
TraceFormatError line that names the file and where in it the problem is; nothing else may escape."""
from __future__ import annotations

import copy
import gzip
import json
import os
import random
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest

from infragent.probes.analyze import analyze
from infragent.probes.feedback import Feedback
from infragent.trace_model import TraceFormatError

DATA = Path(__file__).parent / "data" / "h200"
SEED = 20251204
CASES = 200
# the small traces mostly (193 and 4504 events); the 9k-event GEMM trace now and then
SOURCES = (("flash_attention_long", 0.45), ("mlp_eager_vs_cudagraph", 0.45), ("gemm_with_h2d_copy", 0.10))

# where a located message points: a byte offset, an event by index, or a field (`traceEvents`, `deviceProperties`,
# `traceEvents[3].args`, ... as the first word after the path)
LOCATED = re.compile(r"\bbytes? \d+|\btraceEvents\[\d+\]|^[A-Za-z_$][\w.\[\]$]*: ")


class Source:
    def __init__(self, name: str) -> None:
        self.name = name
        self.gz = (DATA / f"{name}.json.gz").read_bytes()
        self.text = gzip.decompress(self.gz)
        self.doc = json.loads(self.text)

    def events(self) -> dict[str, Any]:
        return copy.deepcopy(self.doc)


# ------------------------------------------------------------------------------------------------ mutations
# Each takes (rng, source) and gives (the file's bytes, its suffix: ".json" or ".json.gz").

Mutation = Callable[[random.Random, Source], tuple[bytes, str]]


def _dump(doc: Any, rng: random.Random) -> tuple[bytes, str]:
    """A document written as JSON (non-ASCII escaped or as UTF-8, lone surrogates as their invalid UTF-8
    bytes), gzipped half the time (as Kineto's .json.gz)."""
    ascii_only = rng.random() < 0.5
    text = json.dumps(doc, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    return (gzip.compress(text, mtime=0), ".json.gz") if rng.random() < 0.5 else (text, ".json")


def _events_where(doc: dict, test: Callable[[dict], bool]) -> list[int]:
    return [i for i, e in enumerate(doc["traceEvents"]) if isinstance(e, dict) and test(e)]


def _some(rng: random.Random, items: list, most: int = 8) -> list:
    return rng.sample(items, min(len(items), rng.randint(1, most))) if items else []


def _drop(doc: dict, indices: list[int]) -> None:
    gone = set(indices)
    doc["traceEvents"] = [e for i, e in enumerate(doc["traceEvents"]) if i not in gone]


def truncate_json(rng, src):
    return src.text[:rng.randrange(len(src.text))], ".json"


def truncate_json_then_gzip(rng, src):  # a profiler stopped mid-write, its output gzipped afterwards
    return gzip.compress(src.text[:rng.randrange(len(src.text))], mtime=0), ".json.gz"


def truncate_gzip(rng, src):  # a .json.gz copied half-way
    return src.gz[:rng.randrange(len(src.gz))], ".json.gz"


def truncate_near_end(rng, src):  # the last few bytes missing: the closing brackets
    return _gz_or_not(src.text[:len(src.text) - rng.randint(1, 64)], rng)


def empty_file(rng, src):
    return b"", rng.choice([".json", ".json.gz"])


def whitespace_file(rng, src):
    return rng.choice([b" ", b"\n", b"\n\n  \t"]), ".json"


def gzip_of_nothing(rng, src):  # a valid gzip stream holding zero bytes
    return gzip.compress(b"", mtime=0), ".json.gz"


def gzip_header_only(rng, src):
    return src.gz[:rng.randint(1, 18)], ".json.gz"


def flip_json_bytes(rng, src):
    data = bytearray(src.text)
    for _ in range(rng.randint(1, 12)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return _gz_or_not(bytes(data), rng)


def flip_gzip_bytes(rng, src):
    data = bytearray(src.gz)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data), ".json.gz"


def garbage_after_gzip(rng, src):
    return src.gz + bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))), ".json.gz"


def not_json_at_all(rng, src):
    return rng.choice([b"\x00\x01\x02binary", b"hello world", "ünïcödé".encode(), b"\xff\xfe{}", b"<html></html>",
                       b"42", b'"traceEvents"', b"null", b"true"]), ".json"


def _gz_or_not(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    return (gzip.compress(data, mtime=0), ".json.gz") if rng.random() < 0.5 else (data, ".json")


FIELDS = ("ts", "dur", "ph", "pid", "tid", "name", "cat", "args", "id")


def delete_fields(rng, src):
    doc = src.events()
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 20):
        doc["traceEvents"][i].pop(rng.choice(FIELDS), None)
    return _dump(doc, rng)


def delete_field_everywhere(rng, src):
    doc = src.events()
    field = rng.choice(FIELDS)
    for e in doc["traceEvents"]:
        if rng.random() < 0.5:
            e.pop(field, None)
    return _dump(doc, rng)


WRONG = ("12.5", "NaN", "nan", "Infinity", "-inf", "", None, {"a": 1}, [1, 2], [], True, -1, -1e9, 1e308, 2 ** 63,
         -2 ** 63, 2 ** 70, 0, "\u0000", "0x1f", 1.5)


def wrong_types(rng, src):
    doc = src.events()
    events = list(range(len(doc["traceEvents"])))
    for i in _some(rng, events, 10):
        doc["traceEvents"][i][rng.choice(FIELDS)] = rng.choice(WRONG)
    return _dump(doc, rng)


def wrong_type_one_field(rng, src):
    doc = src.events()
    field, value = rng.choice(FIELDS), rng.choice(WRONG)
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 30):
        doc["traceEvents"][i][field] = value
    return _dump(doc, rng)


def json_nan_and_infinity(rng, src):  # Python's json writes NaN/Infinity tokens, not valid JSON
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("ph") == "X"), 5):
        doc["traceEvents"][i][rng.choice(("ts", "dur"))] = rng.choice([float("nan"), float("inf"), float("-inf")])
    return _dump(doc, rng)


def huge_numbers(rng, src):
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("ph") == "X"), 6):
        field = rng.choice(("ts", "dur", "pid", "tid"))
        doc["traceEvents"][i][field] = rng.choice(
            [1e308, 1.7e308, 9.2e18, 2 ** 64 - 1, 10 ** 30, -1e308, 1e-320] if field in ("ts", "dur") else
            [2 ** 63, 2 ** 64 - 1, -2 ** 63, 2 ** 63 - 1, 10 ** 30, -10 ** 19])
    return _dump(doc, rng)


def drop_kernels_keep_launches(rng, src):
    doc = src.events()
    _drop(doc, _some(rng, _events_where(doc, lambda e: e.get("cat") == "kernel"), 50))
    return _dump(doc, rng)


def drop_launches_keep_kernels(rng, src):
    doc = src.events()
    _drop(doc, _some(rng, _events_where(doc, lambda e: e.get("cat") in ("cuda_runtime", "cuda_driver")), 50))
    return _dump(doc, rng)


def drop_all_gpu_work(rng, src):
    doc = src.events()
    _drop(doc, _events_where(doc, lambda e: e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")))
    return _dump(doc, rng)


def drop_all_host_ops(rng, src):
    doc = src.events()
    _drop(doc, _events_where(doc, lambda e: e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime",
                                                            "cuda_driver", "python_function")))
    return _dump(doc, rng)


def flow_starts_without_ends(rng, src):
    doc = src.events()
    _drop(doc, _some(rng, _events_where(doc, lambda e: e.get("ph") == "f"), 400))
    return _dump(doc, rng)


def flow_ends_without_starts(rng, src):
    doc = src.events()
    _drop(doc, _some(rng, _events_where(doc, lambda e: e.get("ph") == "s"), 400))
    return _dump(doc, rng)


def flow_ids_mangled(rng, src):
    doc = src.events()
    mangle = rng.choice([str, lambda x: 1, lambda x: None, lambda x: -x, lambda x: x + 2 ** 63, lambda x: 1.5,
                         lambda x: {"x": x}, lambda x: f"0x{x:x}"])
    for i in _events_where(doc, lambda e: e.get("ph") in ("s", "f")):
        if rng.random() < 0.7:
            doc["traceEvents"][i]["id"] = mangle(doc["traceEvents"][i]["id"])
    return _dump(doc, rng)


def remove_random_events(rng, src):
    doc = src.events()
    n = len(doc["traceEvents"])
    _drop(doc, rng.sample(range(n), rng.randint(1, n - 1)))
    return _dump(doc, rng)


def keep_one_event(rng, src):
    doc = src.events()
    doc["traceEvents"] = [rng.choice(doc["traceEvents"])]
    return _dump(doc, rng)


def only_metadata_events(rng, src):
    doc = src.events()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    return _dump(doc, rng)


def no_events(rng, src):
    doc = src.events()
    doc["traceEvents"] = []
    return _dump(doc, rng)


def duplicate_events(rng, src):
    doc = src.events()
    events = doc["traceEvents"]
    for i in _some(rng, list(range(len(events))), 200):
        events.insert(rng.randrange(len(events) + 1), copy.deepcopy(events[i]))
    return _dump(doc, rng)


def duplicate_everything(rng, src):
    doc = src.events()
    doc["traceEvents"] = doc["traceEvents"] + copy.deepcopy(doc["traceEvents"])
    return _dump(doc, rng)


def shuffle_events(rng, src):
    doc = src.events()
    rng.shuffle(doc["traceEvents"])
    return _dump(doc, rng)


def args_not_objects(rng, src):
    doc = src.events()
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 40):
        doc["traceEvents"][i]["args"] = rng.choice([[], [1, 2], "args", 3, None, True, {"": None}, {"name": 5}])
    return _dump(doc, rng)


def metadata_args_mangled(rng, src):  # thread/process names: args without 'name', or a non-string one
    doc = src.events()
    for i in _events_where(doc, lambda e: e.get("ph") == "M"):
        doc["traceEvents"][i]["args"] = rng.choice([{}, {"name": None}, {"name": 7}, {"name": ["x"]}, [], "x",
                                                    {"sort_index": "a"}, {"labels": {}}])
    return _dump(doc, rng)


def kernel_args_mangled(rng, src):
    doc = src.events()
    keys = ("correlation", "External id", "stream", "device", "grid", "block", "queued", "context")
    for i in _events_where(doc, lambda e: e.get("cat") in ("kernel", "cuda_runtime", "gpu_memset", "gpu_memcpy")):
        args = doc["traceEvents"][i].get("args")
        if isinstance(args, dict) and rng.random() < 0.5:
            key = rng.choice(keys)
            if rng.random() < 0.3:
                args.pop(key, None)
            else:
                args[key] = rng.choice(WRONG)
    return _dump(doc, rng)


def correlation_as_strings(rng, src):
    doc = src.events()
    for e in doc["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict) and "correlation" in args:
            args["correlation"] = str(args["correlation"])
        if e.get("ph") in ("s", "f") and rng.random() < 0.5:
            e["id"] = str(e["id"])
    return _dump(doc, rng)


def correlation_duplicated(rng, src):
    doc = src.events()
    corr = _events_where(doc, lambda e: isinstance(e.get("args"), dict) and "correlation" in e["args"])
    if corr:
        same = doc["traceEvents"][rng.choice(corr)]["args"]["correlation"]
        for i in _some(rng, corr, 100):
            doc["traceEvents"][i]["args"]["correlation"] = same
    flows = _events_where(doc, lambda e: e.get("ph") in ("s", "f"))
    if flows:
        same = doc["traceEvents"][rng.choice(flows)]["id"]
        for i in _some(rng, flows, 100):
            doc["traceEvents"][i]["id"] = same
    return _dump(doc, rng)


def trace_events_not_a_list(rng, src):
    doc = src.events()
    doc["traceEvents"] = rng.choice([{}, {"0": doc["traceEvents"][0]}, "events", 3, None, True])
    return _dump(doc, rng)


def trace_events_missing(rng, src):
    doc = src.events()
    del doc["traceEvents"]
    return _dump(doc, rng)


def events_not_objects(rng, src):
    doc = src.events()
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 5):
        doc["traceEvents"][i] = rng.choice([None, 1, "event", [], [1, 2], True])
    return _dump(doc, rng)


def top_level_array(rng, src):  # the JSON Array Format: valid, sometimes without its closing bracket
    events = src.events()["traceEvents"]
    text = json.dumps(events).encode()
    if rng.random() < 0.5:
        text = text[:-1] + rng.choice([b"", b",", b",\n"])
    return _gz_or_not(text, rng)


def top_level_array_of_junk(rng, src):
    return _gz_or_not(json.dumps(rng.choice([[1, 2, 3], [[]], ["a"], [None], [{}], []])).encode(), rng)


def top_level_scalar(rng, src):
    return _gz_or_not(rng.choice([b"1", b"null", b'"x"', b" 3.5 ", b"[]", b"{}"]), rng)


def metadata_wrong_types(rng, src):
    doc = src.events()
    key = rng.choice(["baseTimeNanoseconds", "deviceProperties", "otherData", "displayTimeUnit", "distributedInfo",
                      "schemaVersion", "traceName"])
    doc[key] = rng.choice(WRONG)
    return _dump(doc, rng)


def device_properties_mangled(rng, src):
    doc = src.events()
    doc["deviceProperties"] = rng.choice([[{}], [{"id": "zero"}], [None], [{"numSms": "x", "name": 5}], [[1]],
                                          [{"id": 0, "numSms": 0, "totalGlobalMem": -1}]])
    return _dump(doc, rng)


JUNK = ("", " ", "\u0000", "\x07\x1b[31m", "💥🔥" * 20, "\u202etxet-lrt", "名前" * 50, "a" * 5000, "\n\n", "\\", '"',
        "ü\u0301", "\ufeff", "\uffff", "%s%n{0}", "<script>", "\t\r")
BAD_UNICODE = ("\ud800", "\udfff\ud800")  # lone surrogates: invalid escapes, or invalid UTF-8 bytes


def unicode_junk_names(rng, src):
    doc = src.events()
    junk = JUNK + (BAD_UNICODE if rng.random() < 0.25 else ())
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 60):
        e = doc["traceEvents"][i]
        key = rng.choice(["name", "name", "name", "cat", "cat", "ph"])
        e[key] = rng.choice(junk) + (e.get(key) if isinstance(e.get(key), str) and rng.random() < 0.5 else "")
    return _dump(doc, rng)


def unknown_phases(rng, src):
    doc = src.events()
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 30):
        doc["traceEvents"][i]["ph"] = rng.choice(["Z", "x", "XX", "", "b", "e", "O", "N", "D", "P", "(", "?"])
    return _dump(doc, rng)


def unmatched_begin_end(rng, src):
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("ph") == "X"), 20):
        e = doc["traceEvents"][i]
        e["ph"] = rng.choice(["B", "E"])
        if rng.random() < 0.5:
            e.pop("dur", None)
    return _dump(doc, rng)


def counters_mangled(rng, src):
    doc = src.events()
    e0 = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    for _ in range(rng.randint(1, 6)):
        doc["traceEvents"].insert(rng.randrange(len(doc["traceEvents"])), {
            "ph": "C", "name": rng.choice(["mem", "", "💥"]), "pid": e0["pid"], "tid": e0["tid"],
            "ts": e0["ts"] + rng.random() * 100,
            "args": rng.choice([{"v": 1}, {"v": "1"}, {"a": 1, "b": None}, [], 5, "x", {}, {"v": 1e308},
                                {"v": 10 ** 400}, {"v": True}])})
        if rng.random() < 0.2:
            doc["traceEvents"][rng.randrange(len(doc["traceEvents"]))].update(ph="C", ts=rng.choice([1e300, -1e300]))
    return _dump(doc, rng)


def kernel_on_new_device(rng, src):
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("cat") == "kernel"), 10):
        e = doc["traceEvents"][i]
        e["pid"] = rng.choice([1, 7, 99, "gpu", -1, 2 ** 40])
        if rng.random() < 0.5:
            e["tid"] = rng.choice([8, 123, "stream 9", -3])
        if isinstance(e.get("args"), dict) and rng.random() < 0.5:
            e["args"]["device"] = e["pid"]
    return _dump(doc, rng)


def zero_duration_kernels(rng, src):
    doc = src.events()
    for i in _events_where(doc, lambda e: e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")):
        if rng.random() < 0.7:
            doc["traceEvents"][i]["dur"] = rng.choice([0, 0.0, 1e-9])
    return _dump(doc, rng)


def kernels_end_before_start(rng, src):
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("cat") == "kernel"), 5):
        doc["traceEvents"][i]["dur"] = -rng.choice([0.001, 1, 1e6])
    return _dump(doc, rng)


def kernels_before_launch(rng, src):  # the kernel starts before its launch (clock skew, or a bad merge)
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: e.get("cat") == "kernel"), 30):
        doc["traceEvents"][i]["ts"] -= rng.choice([1e3, 1e6, 1e9])
    return _dump(doc, rng)


def timestamps_jittered(rng, src):
    doc = src.events()
    for i in _some(rng, _events_where(doc, lambda e: isinstance(e.get("ts"), (int, float))), 200):
        e = doc["traceEvents"][i]
        e["ts"] = rng.choice([0, -1.0, e["ts"] * 2, e["ts"] + rng.uniform(-1e4, 1e4), 1e15])
    return _dump(doc, rng)


def overlapping_same_stream(rng, src):  # two kernels on one stream at once (not possible on a real GPU)
    doc = src.events()
    kernels = _events_where(doc, lambda e: e.get("cat") == "kernel")
    for i in _some(rng, kernels, 20):
        other = doc["traceEvents"][rng.choice(kernels)]
        e = doc["traceEvents"][i]
        e["ts"], e["dur"] = other["ts"] + other.get("dur", 0) / 2, other.get("dur", 1) * rng.choice([0.1, 3, 1000])
    return _dump(doc, rng)


def categories_swapped(rng, src):
    doc = src.events()
    cats = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op", "ac2g", "Trace", "overhead",
            "gpu_user_annotation", "python_function", "user_annotation"]
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 60):
        doc["traceEvents"][i]["cat"] = rng.choice(cats)
    return _dump(doc, rng)


def nested_junk_in_event(rng, src):
    doc = src.events()
    key = rng.choice(["extra", "args", "args", "bp", "s", "id2"])
    for i in _some(rng, list(range(len(doc["traceEvents"]))), 10):
        doc["traceEvents"][i][key] = {"a": [{"b": [None, {"c": "💥"}]}]}
    return _dump(doc, rng)


MUTATIONS: list[Mutation] = [
    truncate_json, truncate_json_then_gzip, truncate_gzip, truncate_near_end, empty_file, whitespace_file,
    gzip_of_nothing, gzip_header_only, flip_json_bytes, flip_gzip_bytes, garbage_after_gzip, not_json_at_all,
    delete_fields, delete_field_everywhere, wrong_types, wrong_type_one_field, json_nan_and_infinity, huge_numbers,
    drop_kernels_keep_launches, drop_launches_keep_kernels, drop_all_gpu_work, drop_all_host_ops,
    flow_starts_without_ends, flow_ends_without_starts, flow_ids_mangled, remove_random_events, keep_one_event,
    only_metadata_events, no_events, duplicate_events, duplicate_everything, shuffle_events, args_not_objects,
    metadata_args_mangled, kernel_args_mangled, correlation_as_strings, correlation_duplicated,
    trace_events_not_a_list, trace_events_missing, events_not_objects, top_level_array, top_level_array_of_junk,
    top_level_scalar, metadata_wrong_types, device_properties_mangled, unicode_junk_names, unknown_phases,
    unmatched_begin_end, counters_mangled, kernel_on_new_device, zero_duration_kernels, kernels_end_before_start,
    kernels_before_launch, timestamps_jittered, overlapping_same_stream, categories_swapped, nested_junk_in_event,
]


def mutated_traces(folder: Path, cases: int = CASES, seed: int = SEED) -> list[tuple[str, Path]]:
    """`cases` mutated traces written under folder (same seed, same files): every mutation in turn, each on a
    source drawn by weight; the name says which mutation of which source."""
    rng = random.Random(seed)
    sources = {name: Source(name) for name, _ in SOURCES}
    names, weights = zip(*SOURCES)
    out = []
    for i in range(cases):
        mutate = MUTATIONS[i % len(MUTATIONS)]
        src = sources[rng.choices(names, weights)[0]]
        data, suffix = mutate(random.Random(rng.getrandbits(64)), src)
        label = f"{i:03d}-{mutate.__name__}-{src.name}"
        path = folder / f"{label}{suffix}"
        path.write_bytes(data)
        out.append((label, path))
    return out


def _last_frame(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}: {f.line}"


def _check_one(path: Path) -> str | None:
    """None when analyze(path) gave a Feedback or a one-line located TraceFormatError; else what went wrong."""
    try:
        result = analyze(path)
    except TraceFormatError as err:
        message = str(err)
        problems = []
        if "\n" in message or "\r" in message:
            problems.append("more than one line")
        if str(path) not in message:
            problems.append("does not name the file")
        rest = message.split(str(path), 1)[-1].removeprefix(": ")
        if not LOCATED.search(rest):
            problems.append("does not say where (byte offset, traceEvents[N] or a field)")
        return f"TraceFormatError {'; '.join(problems)}: {message[:400]!r}" if problems else None
    except Exception as err:  # noqa: BLE001 - any other exception is what the fuzz looks for
        return f"{type(err).__name__}: {str(err)[:300]} [at {_last_frame(err)}]"
    if not isinstance(result, Feedback):
        return f"returned {type(result).__name__}, not a Feedback"
    return None


def test_mutations_are_reproducible(tmp_path):
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        runs.append([path.read_bytes() for _, path in mutated_traces(tmp_path / name, 30)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 20


def test_200_mutated_kineto_traces_analyze_or_fail_located(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path / "artifacts"))
    traces = tmp_path / "traces"
    traces.mkdir()
    cases = mutated_traces(traces)
    assert len(cases) == CASES
    failures = [f"{label}: {problem}" for label, path in cases if (problem := _check_one(path)) is not None]
    assert not failures, f"{len(failures)} of {CASES} mutated traces broke analyze:\n" + "\n".join(failures)


BIG_FILE_PATHS = {
    # what traces of more than 400k events take: batches decoded by two processes (lean, args dropped)
    "two_processes": {"PARALLEL_ABOVE": 1, "KEEP_ARGS_BELOW_BYTES": 0, "BATCH": 700},
    # what plain files of 64 MB and more take: memory-mapped, their two halves decoded in place by two processes
    "halves": {"MAP_ABOVE_BYTES": 1},
}


@pytest.mark.parametrize("path_name", sorted(BIG_FILE_PATHS))
def test_mutated_traces_on_the_big_file_paths(tmp_path, monkeypatch, path_name):
    """The same rules where big traces are read: the thresholds lowered so that small mutated files take it."""
    from infragent.analysis import trace_load, trace_read

    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path / "artifacts"))
    for name, value in BIG_FILE_PATHS[path_name].items():
        monkeypatch.setattr(trace_load, name, value)
        if hasattr(trace_read, name):
            monkeypatch.setattr(trace_read, name, value)
    traces = tmp_path / "traces"
    traces.mkdir()
    failures = [f"{label}: {problem}" for label, path in mutated_traces(traces, 60, SEED + 1)
                if (problem := _check_one(path)) is not None]
    assert not failures, f"{len(failures)} of 60 mutated traces broke analyze ({path_name}):\n" + "\n".join(failures)


def test_cli_analyze_on_truncated_trace_prints_one_line_and_no_traceback(tmp_path):
    text = gzip.decompress((DATA / "flash_attention_long.json.gz").read_bytes())
    path = tmp_path / "truncated.json"
    path.write_bytes(text[:len(text) * 2 // 3])
    run = subprocess.run([sys.executable, "-m", "infragent.cli", "analyze", str(path)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "INFRAGENT_ARTIFACTS": str(tmp_path / "artifacts")})
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: ") and str(path) in lines[0] and LOCATED.search(lines[0].split(str(path))[-1])
