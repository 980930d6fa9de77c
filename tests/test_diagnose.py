"""`infragent diagnose` on our own server launched as a black box (a subprocess we only reach over HTTP, /proc
and py-spy): a bottleneck planted through a launch flag is named with its evidence, the same load on an
unplanted server names none, and bad input gets one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from infragent.probes.diagnose import DiagnoseConfig, DiagnoseError, run_diagnose
from server_fixture import SRC, free_port, process_server, thread_server
from text_only_server import text_only_front


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))


def _serve(*flags: str) -> Iterator[str]:
    with process_server("--max-model-len", "1024", "--kv-cache-gb", "0.1", *flags) as (url, _):
        yield url


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A server whose running batch is capped below the load's concurrency, profiling to a folder."""
    folder = tmp_path_factory.mktemp("profiles")
    for url in _serve("--max-num-seqs", "2", "--profile-dir", str(folder)):
        yield url, folder


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    """The same server with no bottleneck planted: a batch limit above the load, the native tokenizer."""
    yield from _serve("--max-num-seqs", "16")


@pytest.fixture(scope="module")
def slow_tokenizer() -> Iterator[str]:
    """The same server tokenizing in Python (--tokenizer-mode slow)."""
    yield from _serve("--max-num-seqs", "16", "--tokenizer-mode", "slow")


def _kinds(fb) -> dict[str, dict]:  # noqa: ANN001
    return {b["kind"]: b for b in fb.details["bottlenecks"]}


def test_a_batch_limit_below_the_offered_concurrency_is_named_from_outside(capped) -> None:
    url, folder = capped
    fb = run_diagnose(DiagnoseConfig(url, seconds=6, concurrency=8, input_len=64, output_len=32))
    found = _kinds(fb)
    assert "queueing at the batch limit" in found, fb.render()
    cap = found["queueing at the batch limit"]
    assert "held at 2 (--max-num-seqs 2 on the launch line)" in cap["claim"] and cap["acts_on"] == ["batch_limit"]
    assert any("waiting > 0 in" in line and "infragent metrics" in line for line in cap["evidence"])
    assert "tokenization" not in found
    assert fb.locality["metrics"] == "infragent" and "infragent.cli serve" in fb.locality["server"]
    # the profile endpoints: a trace written to the server's folder, read by analyze
    traces = fb.details["profile"]["traces"]
    assert traces and Path(traces[0]).parent == folder and fb.details["profile"]["reading"], fb.details["profile"]
    assert fb.next_probes[0].startswith("optimize with a knob that acts on batch_limit")


def test_the_same_load_on_an_unplanted_server_names_no_queue_and_no_tokenizer(plain) -> None:
    fb = run_diagnose(DiagnoseConfig(plain, seconds=6, concurrency=8, input_len=64, output_len=32))
    found = _kinds(fb)
    planted = {"queueing at the batch limit", "queueing below the batch limit", "tokenization"}
    assert not planted & set(found), fb.render()
    assert any("profiling is off" in line for line in fb.details["could_not_see"]), fb.details["could_not_see"]


def test_slow_tokenization_on_the_serving_process_is_named_with_its_function(slow_tokenizer, plain) -> None:
    load = dict(seconds=8, concurrency=8, input_len=900, output_len=16)
    fb = run_diagnose(DiagnoseConfig(slow_tokenizer, **load))
    found = _kinds(fb)
    assert "tokenization" in found, fb.render()
    claim = found["tokenization"]
    assert "tokenizer_slow.py" in claim["claim"] and claim["acts_on"] == ["tokenizer"]
    assert any("ms of tokenization CPU per request" in line for line in claim["evidence"])
    control = run_diagnose(DiagnoseConfig(plain, **load))  # the native tokenizer under the same load
    assert "tokenization" not in _kinds(control), control.render()


def test_a_url_that_does_not_answer_is_one_line() -> None:
    with pytest.raises(DiagnoseError, match=r"--base-url http://127.0.0.1:\d+: nothing answers .*start the server"):
        run_diagnose(DiagnoseConfig(f"http://127.0.0.1:{free_port()}", seconds=1))
    done = subprocess.run([sys.executable, "-m", "infragent.cli", "diagnose", "--base-url",
                           f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("error: --base-url") and len(done.stderr.strip().splitlines()) == 1


def test_a_pid_that_is_not_the_server_is_refused_naming_the_one_that_is(plain) -> None:
    with pytest.raises(DiagnoseError, match=r"--pid \d+: pid \d+ .* does not serve port \d+; pid \d+ .*infragent"
                                            r".* listens there: pass --pid \d+"):
        run_diagnose(DiagnoseConfig(plain, pid=os.getpid(), seconds=1))


def test_a_server_without_metrics_or_profile_endpoints_says_what_it_could_not_see() -> None:
    with thread_server(max_num_seqs=4) as upstream, text_only_front(upstream) as url:
        fb = run_diagnose(DiagnoseConfig(url, seconds=3, concurrency=4, input_len=32, output_len=8, pyspy=False))
    blind = " | ".join(fb.details["could_not_see"])
    assert "no /metrics" in blind and "no profile endpoints" in blind, blind
    assert fb.locality["metrics"] == "none" and fb.numbers["output_throughput"].value > 0


def test_a_server_that_dies_under_the_load_is_one_line_naming_its_process(tmp_path) -> None:
    import signal
    import threading

    with process_server("--max-model-len", "1024", "--kv-cache-gb", "0.1") as (url, proc):
        threading.Timer(4.0, lambda: os.kill(proc.pid, signal.SIGKILL)).start()
        try:
            fb = run_diagnose(DiagnoseConfig(url, seconds=12, concurrency=4, input_len=32, output_len=64))
        except DiagnoseError as err:  # it died before the measured requests: one line, no traceback
            assert f"its process {proc.pid} is gone" in str(err), str(err)
        else:
            assert fb.verdict == "fail", fb.render()
            assert fb.finding.startswith(f"the server went away during the load: its process {proc.pid} is gone")
