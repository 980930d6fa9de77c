"""Trace analyses: loading (Chrome, Kineto, gzip, malformed), intervals, breakdown, overlap, idle, critical
path, diff/attribution, with hand-computed answers."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infragent.analysis.breakdown import breakdown
from infragent.analysis.gpu_overlap import comm_comp_overlap
from infragent.analysis.gpu_time import temporal_breakdown
from infragent.analysis.critical_path import critical_path
from infragent.analysis.diff import amdahl, diff
from infragent.analysis.idle import idle
from infragent.analysis.intervals import gaps, intersect, length, merge, overlap_ns
from infragent.analysis.kernel_names import hta_kind
from infragent.analysis.overlap import never_overlapping, overlap
from infragent.analysis.trace_load import columns_from_trace, load_columns
from infragent.trace import Recorder, span
from infragent.trace_model import TraceFormatError


def _write(tmp_path: Path, events: list, name: str = "t.json", **top) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def X(name, ts, dur, tid=1, pid=1, cat="span", **args):  # noqa: N802
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_intervals_merge_overlap_and_gaps():
    s, e = merge(np.array([5, 0, 2, 10]), np.array([7, 3, 5, 12]))  # [0,3)+[2,5) touch [5,7): one run
    assert s.tolist() == [0, 10] and e.tolist() == [7, 12]
    assert length(np.array([0, 1]), np.array([4, 2])) == 4
    a, b = merge(np.array([0, 10]), np.array([5, 20])), merge(np.array([5, 12]), np.array([11, 14]))
    assert intersect(a, b)[0].tolist() == [10, 12] and overlap_ns(a, b) == 1 + 2  # touching at 5 is not overlap
    gs, ge = gaps(np.array([2, 8]), np.array([4, 9]), lo=0, hi=12)
    assert list(zip(gs.tolist(), ge.tolist())) == [(0, 2), (4, 8), (9, 12)]


def test_loads_chrome_event_types_gzip_and_array_form(tmp_path):
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker"}},
              X("step", 0, 100), X("attention", 10, 30, layer=0), X("mlp", 50, 20),
              {"ph": "B", "name": "io", "pid": 1, "tid": 2, "ts": 20}, {"ph": "E", "pid": 1, "tid": 2, "ts": 45},
              {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 30, "s": "t"},
              {"ph": "C", "name": "kv", "pid": 1, "tid": 1, "ts": 5, "args": {"used": 3}},
              {"ph": "C", "name": "kv", "pid": 1, "tid": 1, "ts": 60, "args": {"used": 7}}]
    path = _write(tmp_path, events)
    c = load_columns(path)
    assert len(c) == 5 and sorted(c.names) == ["attention", "io", "mark", "mlp", "step"]
    io = np.flatnonzero(c.select("io"))[0]
    assert c.end[io] - c.start[io] == 25_000 and c.tracks[c.track[io]].name == "worker"
    assert c.depth[np.flatnonzero(c.select("attention"))[0]] == 1 and c.attrs(np.flatnonzero(c.select("attention"))[0]) == {"layer": 0}
    assert c.counters["kv"][1].tolist() == [3, 7] and c.select("thread:work*").sum() == 2
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert len(load_columns(gz)) == 5
    array = tmp_path / "a.json"  # JSON Array Format without its closing bracket, as the format allows
    array.write_text("[" + ",\n".join(json.dumps(e) for e in events[:4]) + ",\n")
    assert len(load_columns(array)) == 3


def test_recorder_trace_round_trips_into_columns(tmp_path):
    with Recorder() as rec:
        with span("step"):
            with span("attention", layer=1):
                pass
            with span("mlp"):
                pass
    trace = rec.trace()
    direct, loaded = columns_from_trace(trace), load_columns(trace.save(tmp_path / "rec.json"))
    assert sorted(direct.names) == sorted(loaded.names) == ["attention", "mlp", "step"]
    assert direct.depth.tolist() == loaded.depth.tolist() == [0, 1, 1]
    assert (direct.end - direct.start).tolist() == pytest.approx((loaded.end - loaded.start).tolist(), abs=1)


@pytest.mark.parametrize("content, message", [
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "name": "b", "ts": "x"}]}',
     "traceEvents[1].ts"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X" "name": 1}]}', "(byte 73)"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', "ends at byte 77"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "dur": 2}]}', "traceEvents[0] (X 'a') has no ts"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 4, "dur": -2}]}', "traceEvents[0] (X 'a') has a negative dur"),
    (b"hello", "byte 0 should open a JSON object or array"),
    (gzip.compress(b'{"traceEvents": []}')[:20], "broken gzip data"),
])
def test_malformed_traces_name_the_event_or_byte(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as err:
        load_columns(path)
    assert message in str(err.value) and str(path) in str(err.value)
    cli = subprocess.run([sys.executable, "-m", "infragent.cli", "analyze", str(path)], capture_output=True, text=True)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr and message in cli.stderr


def test_errors_in_later_batches_give_the_index_in_the_whole_trace(tmp_path, monkeypatch):
    from infragent.analysis import trace_load

    monkeypatch.setattr(trace_load, "BATCH", 3)
    events = [X(f"e{i}", i, 1) for i in range(7)]
    assert len(load_columns(_write(tmp_path, events))) == 7
    events[5]["dur"] = "long"
    with pytest.raises(TraceFormatError, match=r"traceEvents\[5\]\.dur"):
        load_columns(_write(tmp_path, events))


def test_two_process_decode_matches_one_process(tmp_path, monkeypatch):
    from infragent.analysis import trace_load

    events = [X(f"op{i % 4}", i, 2, tid=1 + i % 3, cat=f"c{i % 2}") for i in range(40)]
    events += [{"ph": "B", "name": "io", "pid": 1, "tid": 9, "ts": 3}, {"ph": "E", "pid": 1, "tid": 9, "ts": 30}]
    path = _write(tmp_path, events)
    one = load_columns(path, keep_args=False)
    monkeypatch.setattr(trace_load, "BATCH", 7)
    monkeypatch.setattr(trace_load, "PARALLEL_ABOVE", 10)
    calls = []
    real = trace_load._decode_in_two_processes
    monkeypatch.setattr(trace_load, "_decode_in_two_processes", lambda *a: calls.append(1) or real(*a))
    two = load_columns(path, keep_args=False)
    assert calls  # the forked path ran
    as_rows = lambda c: sorted(zip([c.names[i] for i in c.name], [c.cats[i] for i in c.cat],  # noqa: E731
                                   [c.tracks[i].tid for i in c.track], c.start.tolist(), c.end.tolist()))
    assert as_rows(two) == as_rows(one) and len(one) == 41
    events[15]["ts"] = "late"  # in a batch the child decodes
    with pytest.raises(TraceFormatError, match=r"traceEvents\[15\]\.ts"):
        load_columns(_write(tmp_path, events), keep_args=False)


def test_big_files_decode_in_two_halves_in_place_and_agree(tmp_path, monkeypatch):
    from infragent.analysis import trace_halves, trace_load

    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker"}}]
    events += [X(f"op{i % 5}", i * 3, 2, tid=1 + i % 2, cat="kernel" if i % 2 else "cpu_op") for i in range(400)]
    events += [{"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 50},
               {"ph": "C", "name": "kv", "pid": 1, "tid": 1, "ts": 7, "args": {"used": 3}},
               {"ph": "s", "id": 1, "pid": 1, "tid": 2, "ts": 3, "cat": "ac2g", "name": "ac2g"},
               {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 6, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"traceEvents": events, "otherData": {"k": 1}, "traceName": "x]"}))
    careful = load_columns(path, keep_args=False)
    monkeypatch.setattr(trace_load, "MAP_ABOVE_BYTES", 100)
    used = []
    real = trace_halves.decode_halves
    monkeypatch.setattr(trace_halves, "decode_halves", lambda *a: used.append(1) or real(*a))
    fast = load_columns(path)
    assert used and len(fast) == len(careful) == 401 and fast.meta["k"] == 1
    rows = lambda c: sorted(zip([c.names[i] for i in c.name], c.start.tolist(), c.end.tolist(),  # noqa: E731
                                [c.tracks[i].name for i in c.track]))
    assert rows(fast) == rows(careful) and fast.counters["kv"][1].tolist() == [3.0] and fast.flows.shape == careful.flows.shape == (1, 2)
    assert path.read_text().count("]") == json.dumps(
        {"traceEvents": events, "otherData": {"k": 1}, "traceName": "x]"}).count("]")  # the file is untouched
    events[300]["ts"] = "late"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceFormatError, match=r"traceEvents\[300\]\.ts"):  # falls back to the careful path
        load_columns(path)


def test_breakdown_inclusive_exclusive_and_phase(tmp_path):
    c = load_columns(_write(tmp_path, [X("prefill", 0, 100), X("attention", 10, 30), X("attention", 50, 20),
                                       X("decode", 200, 10), X("attention", 202, 5)]))
    rows = {r.key: r for r in breakdown(c)}
    assert (rows["prefill"].inclusive_ns, rows["prefill"].exclusive_ns) == (100_000, 50_000)
    assert (rows["attention"].inclusive_ns, rows["attention"].count) == (55_000, 3)
    phases = {r.key: r.exclusive_ns for r in breakdown(c, "phase")}
    assert phases == {"prefill": 100_000, "decode": 10_000}
    assert [r.key for r in breakdown(c, top=1)] == ["attention"]


def test_hta_conventions_on_a_hand_computed_gpu_trace(tmp_path):
    assert [hta_kind(n) for n in ("ncclDevKernel_AllReduce", "Memcpy HtoD", "Memset (Device)", "sgemm",
                                     "cudaMemcpyKernel", "waitSync")] == \
        ["communication", "memory", "memory", "computation", "other", "other"]
    gpu = [X("sgemm", 0, 10, tid=7, pid=0, cat="kernel"), X("relu", 10, 5, tid=7, pid=0, cat="kernel"),
           X("ncclDevKernel_AllReduce", 8, 10, tid=20, pid=0, cat="kernel"),
           X("Memcpy HtoD", 30, 4, tid=7, pid=0, cat="gpu_memcpy"), X("aten::mm", 0, 3, tid=9, cat="cpu_op")]
    c = load_columns(_write(tmp_path, gpu))
    tb = temporal_breakdown(c)  # busy [0,18) + [30,34): kernel 34, idle 12, compute [0,15) = 15
    assert (tb.kernel_ns, tb.idle_ns, tb.compute_ns, tb.non_compute_ns) == (34_000, 12_000, 15_000, 7_000)
    assert comm_comp_overlap(c) == pytest.approx(70.0)  # [8,15) of the 10 µs of NCCL


def test_hta_agrees_on_a_synthetic_kineto_trace(tmp_path):
    pytest.importorskip("hta", reason="HTA is an optional extra (pip install .[hta])")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from kineto_synth import write
    from hta.trace_analysis import TraceAnalysis

    (tmp_path / "r").mkdir()
    c = load_columns(write(tmp_path / "r" / "rank0.json", 3000, seed=3))
    hta = TraceAnalysis(trace_dir=str(tmp_path / "r"))
    hta_overlap = hta.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
    hta_tb = hta.get_temporal_breakdown(visualize=False).iloc[0]
    tb = temporal_breakdown(c)
    assert comm_comp_overlap(c) == pytest.approx(hta_overlap, abs=0.1)
    for part in ("idle", "compute", "non_compute"):
        assert tb.pct(part) == pytest.approx(hta_tb[f"{part}_time_pctg"], abs=0.1)


def test_overlap_names_threads_and_finds_pairs_that_never_overlap(tmp_path):
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "engine"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "kv-transfer"}}]
    for k in range(10):  # compute and transfer alternate: busy in the same stretch, never at once
        events += [X("compute", 100 * k, 60, tid=1), X("kv.transfer", 100 * k + 60, 35, tid=2)]
    events += [X("sampler", 5, 40, tid=3)]  # overlaps compute: not a never-pair
    c = load_columns(_write(tmp_path, events))
    o = overlap(c, "kv.transfer", "compute")
    assert o.overlap_ns == 0 and o.never and o.a_threads == ["kv-transfer (pid 1, tid 2)"]
    assert overlap(c, "thread:engine", "cat:span").share_of_a == pytest.approx(1.0)
    found = never_overlapping(c)
    assert [(p.a, p.b) for p in found] == [("compute @ engine", "kv.transfer @ kv-transfer")]


def test_idle_gaps_are_classified(tmp_path):
    events = [X("work", 0, 10, tid=1), X("work", 20, 10, tid=1),  # gap [10,20): GIL samples cover it
              X("gil.wait", 10, 9, tid=1, cat="gil"),
              X("produce", 30, 15, tid=2),  # thread 1 wakes at 45.1 µs, right after produce ends: hand-off
              X("work", 45.1, 5, tid=1), X("work", 150, 5, tid=1)]  # gap [50.1,150): nothing explains it
    c = load_columns(_write(tmp_path, events))
    t1 = next(t for t in idle(c) if "tid 1" in t.track)
    assert t1.by_kind == {"gil": 10_000, "lock/queue": 15_100, "idle": 99_900}
    handoff = next(g for g in t1.largest if g.kind == "lock/queue")
    assert handoff.cause == "produce on thread 2"


def test_critical_path_follows_flows(tmp_path):
    events = [X("aten::mm", 0, 10, tid=1, cat="cpu_op"), X("cudaLaunchKernel", 2, 3, tid=1, cat="cuda_runtime"),
              X("aten::add", 12, 4, tid=1, cat="cpu_op"),
              X("sgemm", 20, 50, tid=7, pid=0, cat="kernel"),
              {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 2, "cat": "ac2g", "name": "ac2g"},
              {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 20, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    c = load_columns(_write(tmp_path, events))
    assert c.flows.shape == (1, 2)
    path = critical_path(c)
    assert [c.names[c.name[r]] for r in path.rows] == ["sgemm", "cudaLaunchKernel", "aten::mm"][:len(path.rows)]
    assert path.used_flows == 1 and path.by_name["sgemm"] == 50_000 and path.total_ns == 70_000


def test_diff_attributes_the_change_to_spans_layers_and_predicts_it(tmp_path):
    def trace(name, slow):
        events = []
        t = 0
        for layer in range(4):
            d = 10 + (10 if slow and layer < 2 else 0)
            events += [X("attention", t, d, layer=layer), X("mlp", t + d, 10, layer=layer)]
            t += d + 10
        return load_columns(_write(tmp_path, [X("prefill", 0, t)] + events, name))

    d = diff(trace("base.json", False), trace("cand.json", True), metric="TTFT")
    assert d.change == pytest.approx(20 / 80) and d.predicted_change == pytest.approx(d.change)
    top = d.spans[0]
    assert (top.name, top.phase, top.layers, top.share_of_delta) == ("attention", "prefill", "layers 0-1", 1.0)
    assert d.headline().startswith("TTFT +25.0%: 100% from attention (prefill, layers 0-1)")
    assert amdahl({"attention": 0.5, "mlp": 0.5}, {"attention": 1.5}) == pytest.approx(1.25)
