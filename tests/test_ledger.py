"""The ledger (SQLite, WAL): what it keeps, and a measure run that survives kill -9 and resumes."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infragent.lab.environment import capture
from infragent.lab.ledger import SCHEMA, Ledger, LedgerError
from server_fixture import tiny_target_toml

SRC = Path(__file__).resolve().parent.parent / "src"


def _feedback(verdict: str = "pass") -> dict:
    return {"probe": "bench", "verdict": verdict, "finding": "x", "numbers": {"ratio": {"value": 1.02}}}


def test_records_probes_artifacts_and_environment(tmp_path):
    book = Ledger(tmp_path / "ledger.sqlite")
    env = capture()
    assert env["cores"] and "torch" in env["packages"] and "git_commit" in env
    assert book.environment(env) == book.environment(env)  # stored once
    run = book.start_run("measure", "spec.toml", "abc", book.environment(env))
    raw = tmp_path / "samples.json"
    raw.write_text("[1, 2, 3]")
    book.record_probe(run, "s/0", _feedback(), artifacts=[(str(raw), "raw samples")])
    with pytest.raises(sqlite3.IntegrityError):
        book.record_probe(run, "s/0", _feedback())  # a key is recorded once per run
    assert book.completed_keys(run) == {"s/0"}
    stored = list((tmp_path / "artifacts").rglob("*"))
    assert any(p.is_file() and p.read_text() == "[1, 2, 3]" for p in stored)
    lines = [json.loads(line) for line in book.export_jsonl()]
    assert lines[0]["run"]["id"] == run and lines[0]["probes"][0]["numbers"] == {"ratio": 1.02}
    assert lines[0]["environment"]["cores"] == env["cores"]
    with pytest.raises(LedgerError, match="no run 99"):
        book.run(99)
    assert book.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_that_is_not_a_ledger_is_named(tmp_path):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("hello, not a database" * 100)
    with pytest.raises(LedgerError, match="notes.sqlite"):
        Ledger(bad)


SPEC = tiny_target_toml() + """\

[[scenarios]]
name = "tiny"
num_prompts = 60
max_concurrency = 4
random_input_len = 64
random_output_len = 24
repeats = 6

[[criteria]]
scenario = "tiny"
metric = "ttft_median_ms"
max = 60000
"""


def _cli(*args: str, cwd: Path) -> list[str]:
    return [sys.executable, "-m", "infragent.cli", *args]


def _probe_rows(path: Path) -> list[tuple]:
    db = sqlite3.connect(path, timeout=30)
    try:
        return db.execute("SELECT id, key, created FROM probe_results ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # the measure process has created the file but not yet its tables
        return []
    finally:
        db.close()


def test_kill_9_mid_run_then_resume_loses_nothing(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    ledger = tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": str(SRC), "INFRAGENT_ARTIFACTS": str(tmp_path / "artifacts-in")}
    proc = subprocess.Popen(_cli("measure", str(spec), "--ledger", str(ledger), cwd=tmp_path), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not ledger.exists() or len(_probe_rows(ledger)) < 2):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    before = _probe_rows(ledger)
    assert 2 <= len(before) < 6, before
    book = Ledger(ledger)
    row = book.run(1)
    launches = book.launches(1)
    assert row["status"] == "running" and len(launches) == 1  # the crash left the run open and its target up
    assert launches[0]["stopped"] is None and launches[0]["role"] == "target" and launches[0]["port"]
    orphan = launches[0]["pgid"]
    resumed = subprocess.run(_cli("measure", str(spec), "--ledger", str(ledger), "--resume", "1", cwd=tmp_path),
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"stopped the process group {orphan} (target, port {launches[0]['port']})" in resumed.stderr
    assert Ledger(ledger).launches(1)[0]["status"] == "stopped by resume"
    after = _probe_rows(ledger)
    assert after[:len(before)] == before  # nothing recorded before the crash was lost or redone
    keys = [key for _, key, _ in after]
    assert sorted(keys) == sorted([f"tiny/{i}" for i in range(6)] + ["criterion/0"])
    assert Ledger(ledger).run(1)["status"] == "completed"
    with pytest.raises(ProcessLookupError):
        os.killpg(orphan, 0)
    shown = subprocess.run(_cli("show", "1", "--ledger", str(ledger), cwd=tmp_path), cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert "criterion/0" in shown.stdout and "PASS" in shown.stdout


def test_a_ledger_from_before_candidate_tracking_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(", candidate_pgid INTEGER", ""))
    db.execute("INSERT INTO runs (kind, status, created, updated) VALUES ('optimize', 'running', 0, 0)")
    db.commit()
    db.close()
    ledger = Ledger(path)
    assert ledger.run(1)["candidate_pgid"] is None and ledger.run(1)["kind"] == "optimize"
    ledger.set_run(1, candidate_pgid=4242)
    assert ledger.run(1)["candidate_pgid"] == 4242
