"""The span tracer: recording across threads, decorator and context-manager forms, Chrome round trip,
Kineto import, and the engine's instrumentation."""
import json
import threading
import time

import pytest
import torch

from infragent.trace import Recorder, counter, recording, span
from infragent.trace_model import Trace, TraceFormatError


@span("decorated", kind="fn")
def _decorated(x: int) -> int:
    return x + 1


def test_nothing_is_recorded_without_a_recorder():
    with span("ignored", a=1):
        pass
    counter("ignored", 1)
    assert not recording()
    with Recorder() as rec:
        pass
    assert rec.trace().spans == [] and rec.trace().counters == []


def test_spans_nest_carry_attrs_and_thread_names():
    def worker() -> None:
        with span("work", item=7):
            time.sleep(0.002)
    with Recorder(thread_cpu=True) as rec:
        with span("outer", step=3):
            assert _decorated(1) == 2
            counter("queue", 5)
        thread = threading.Thread(target=worker, name="kv-transfer")
        thread.start()
        thread.join()
    trace = rec.trace()
    outer, inner = trace.named("outer")[0], trace.named("decorated")[0]
    assert outer.attrs == {"step": 3} and inner.attrs == {"kind": "fn"}
    assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
    work = trace.named("work")[0]
    assert trace.thread_name(work.tid) == "kv-transfer" and work.tid != outer.tid
    assert work.dur_ns >= 2_000_000 and work.cpu_ns is not None and work.cpu_ns < work.dur_ns
    assert [(c.name, c.value) for c in trace.counters] == [("queue", 5.0)]


def test_thread_cpu_is_recorded_only_when_asked():
    with Recorder() as rec:
        with span("plain"):
            pass
    assert rec.trace().spans[0].cpu_ns is None


def test_decorator_applied_before_recording_still_records():
    # _decorated was decorated at import time, when nothing recorded.
    with Recorder() as rec:
        _decorated(2)
    assert len(rec.trace().named("decorated")) == 1


def test_exceptions_propagate_through_spans():
    with pytest.raises(KeyError):
        with span("disabled"):
            raise KeyError("x")
    with Recorder() as rec:
        with pytest.raises(KeyError):
            with span("enabled"):
                raise KeyError("x")
    assert len(rec.trace().named("enabled")) == 1


def test_only_one_recorder_at_a_time():
    with Recorder():
        with pytest.raises(RuntimeError, match="already recording"):
            Recorder().start()
    assert not recording()


def test_chrome_trace_round_trips(tmp_path):
    with Recorder() as rec:
        with span("a", n=1, label="x"):
            with span("b"):
                counter("blocks", 3.5)
    trace = rec.trace()
    path = trace.save(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    assert {e["ph"] for e in data["traceEvents"]} == {"M", "X", "C"}
    loaded = Trace.load(path)
    assert loaded.spans == trace.spans
    assert loaded.counters == trace.counters
    assert loaded.threads == trace.threads


def test_bad_trace_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceFormatError, match="bad.json"):
        Trace.load(bad)
    bad.write_text(json.dumps({"events": []}))
    with pytest.raises(TraceFormatError, match="traceEvents"):
        Trace.load(bad)
    with pytest.raises(TraceFormatError, match="missing.json"):
        Trace.load(tmp_path / "missing.json")


def test_kineto_cpu_trace_imports_on_our_clock(tmp_path):
    a = torch.randn(128, 128)
    with Recorder() as rec:
        with span("region"):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    a @ a
    path = tmp_path / "kineto.json"
    prof.export_chrome_trace(str(path))
    ours = rec.trace()
    kineto = Trace.from_kineto(path, wall_offset_ns=ours.meta["wall_offset_ns"])
    mms = [s for s in kineto.spans if s.name == "aten::mm"]
    assert len(mms) == 3 and all(s.category == "cpu_op" for s in mms)
    region = ours.named("region")[0]
    slack = 2_000_000  # wall and monotonic clocks read at slightly different instants
    assert all(region.start_ns - slack <= s.start_ns and s.end_ns <= region.end_ns + slack for s in mms)
    merged = ours.merged(kineto)
    assert len(merged.spans) == len(ours.spans) + len(kineto.spans)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_engine_records_phases_layers_and_cache_operations(backend):
    from infragent.engine.kernels.build import available
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    if backend == "native" and not available():
        pytest.skip("the native kernels do not build here")
    llm = LLM(model="hybrid", kernels=backend)
    with Recorder() as rec:
        llm.generate(["The capital of France is"], SamplingParams(max_tokens=3))
    trace = rec.trace()
    names = {s.name for s in trace.spans}
    decode_read = "kv.gather" if backend == "torch" else "paged_attention"  # native attention reads in place
    assert {"step", "schedule", "prepare", "prefill", "decode", "sample", "detokenize", "attention", "kda",
            "mlp", "kv.write", decode_read, "kda.state_gather", "kda.state_scatter"} <= names
    spec = llm.engine.shape
    steps = len(trace.named("step"))
    assert len(trace.named("mlp")) == steps * spec.num_layers
    assert len(trace.named("attention")) == steps * spec.layer_kinds.count("attention")
    assert {s.attrs["layer"] for s in trace.named("mlp")} == set(range(spec.num_layers))
    assert any(c.name == "kv_blocks_used" and c.value > 0 for c in trace.counters)
