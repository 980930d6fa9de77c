"""The ledger on both backends (a SQLite file, and a real PostgreSQL server the module starts): what it keeps,
a measure run that survives kill -9 and resumes, and two processes appending to one run at once."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from infragent.lab.environment import capture
from infragent.lab.ledger import SCHEMA, Ledger, LedgerError
from infragent.lab.ledger_db import DatabaseError
from pg_server import fresh_database, postgres_server, unavailable
from server_fixture import tiny_target_toml

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """One PostgreSQL server for the module (skipped, with the reason, where none can start)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path: Path, monkeypatch) -> str:
    """A new, empty ledger on each backend; a PostgreSQL ledger's home folder is under tmp_path."""
    monkeypatch.setenv("INFRAGENT_HOME", str(tmp_path))
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return fresh_database(request.getfixturevalue("postgres"), f"ledger_{uuid.uuid4().hex[:12]}")


def _feedback(verdict: str = "pass") -> dict:
    return {"probe": "bench", "verdict": verdict, "finding": "x", "numbers": {"ratio": {"value": 1.02}}}


def test_records_probes_artifacts_and_environment(tmp_path, location):
    book = Ledger(location)
    env = capture()
    assert env["cores"] and "torch" in env["packages"] and "git_commit" in env
    assert book.environment(env) == book.environment(env)  # stored once
    run = book.start_run("measure", "spec.toml", "abc", book.environment(env))
    raw = tmp_path / "samples.json"
    raw.write_text("[1, 2, 3]")
    book.record_probe(run, "s/0", _feedback(), artifacts=[(str(raw), "raw samples")])
    with pytest.raises(DatabaseError):
        book.record_probe(run, "s/0", _feedback())  # a key is recorded once per run
    assert book.completed_keys(run) == {"s/0"}
    stored = list(book.artifact_root.rglob("*"))
    assert any(p.is_file() and p.read_text() == "[1, 2, 3]" for p in stored)
    lines = [json.loads(line) for line in book.export_jsonl()]
    assert lines[0]["run"]["id"] == run and lines[0]["probes"][0]["numbers"] == {"ratio": 1.02}
    assert lines[0]["environment"]["cores"] == env["cores"]
    with pytest.raises(LedgerError, match="no run 99"):
        book.run(99)
    sha = next(p.name for p in stored if p.is_file())
    if book.postgres:  # the bytes live in the database too: a machine without the file gets them back
        (book.artifact_root / sha[:2] / sha).unlink()
    assert book.artifact_path(sha).read_text() == "[1, 2, 3]"
    if not book.postgres:
        assert book.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_that_is_not_a_ledger_is_named(tmp_path):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("hello, not a database" * 100)
    with pytest.raises(LedgerError, match="notes.sqlite"):
        Ledger(bad)


def test_a_server_that_cannot_be_reached_is_named_without_its_password(tmp_path):
    pytest.importorskip("psycopg")
    with pytest.raises(LedgerError, match=r"PostgreSQL ledger: not a usable ledger \(cannot connect") as err:
        Ledger(f"postgresql://u:secret@/db?host={tmp_path}&connect_timeout=2")
    assert "secret" not in str(err.value)


def test_a_read_only_postgres_ledger_refuses_writes(location):
    if "postgresql" not in location:
        pytest.skip("SQLite's read-only mode is the dashboard's (tests/test_ui*)")
    Ledger(location).start_run("measure", None, None, None)
    reader = Ledger.existing(location, readonly=True)
    assert reader.runs()[0]["kind"] == "measure"
    with pytest.raises(DatabaseError, match="read-only"):
        reader.start_run("measure", None, None, None)


APPEND = """
import sys
from infragent.lab.ledger import Ledger
book = Ledger(sys.argv[1])
run, who = int(sys.argv[2]), sys.argv[3]
env = book.environment({"same": "for both"})
for i in range(150):
    experiment = book.experiment(run, f"shared-{i % 5}", {"i": i % 5})
    book.record_probe(run, f"{who}/{i}", {"probe": "bench", "verdict": "pass", "finding": who, "numbers": {}},
                      experiment)
    book.record_hypothesis(run, f"h{i % 3}", {"claim": who, "probe": "bench", "status": "open"})
print(env)
"""


def test_two_processes_appending_to_one_run_lose_nothing(tmp_path, location):
    run = Ledger(location).start_run("optimize", None, None, None)
    script = tmp_path / "append.py"
    script.write_text(APPEND)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    writers = [subprocess.Popen([sys.executable, str(script), location, str(run), who], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    outputs = [w.communicate(timeout=300) for w in writers]
    assert all(w.returncode == 0 for w in writers), [err[-2000:] for _, err in outputs]
    assert outputs[0][0] == outputs[1][0]  # one environment row, whoever wrote it first
    book = Ledger(location)
    assert book.completed_keys(run) == {f"{who}/{i}" for who in "ab" for i in range(150)}
    assert len(book.probe_results(run)) == 300 and len(book.hypotheses(run)) == 3
    assert book.db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 5


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


def _probe_rows(location: str) -> list[tuple]:
    """(id, key, created) of every probe result so far (none while the measure process sets the ledger up)."""
    if "://" not in location and not Path(location).exists():
        return []
    try:
        book = Ledger(location, readonly=True)
        rows = book.db.execute("SELECT id, key, created FROM probe_results ORDER BY id").fetchall()
        book.close()
        return [tuple(r) for r in rows]
    except (LedgerError, DatabaseError):
        return []


def test_kill_9_mid_run_then_resume_loses_nothing(tmp_path, location):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    ledger = location
    env = {**os.environ, "PYTHONPATH": str(SRC), "INFRAGENT_ARTIFACTS": str(tmp_path / "artifacts-in")}
    proc = subprocess.Popen(_cli("measure", str(spec), "--ledger", str(ledger), cwd=tmp_path), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_probe_rows(ledger)) < 2:
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


def test_a_ledger_from_before_candidate_tracking_gains_the_column(tmp_path: Path) -> None:  # SQLite files only
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


def test_ledgers_sharing_a_folder_keep_their_logs_apart(tmp_path, monkeypatch, postgres):
    """Run 1 of a SQLite ledger in ./.infragent and run 1 of each PostgreSQL database write their launch logs,
    reports and worktrees under different folders, so none overwrites another's."""
    monkeypatch.setenv("INFRAGENT_HOME", str(tmp_path))
    homes = {Ledger(tmp_path / "ledger.sqlite").home}
    for name in ("night_a", "night_b"):
        homes.add(Ledger(fresh_database(postgres, f"{name}_{uuid.uuid4().hex[:8]}")).home)
    assert len(homes) == 3 and all(home.is_relative_to(tmp_path) for home in homes)
    url = fresh_database(postgres, f"again_{uuid.uuid4().hex[:8]}")
    assert Ledger(url).home == Ledger(url).home  # the same database, the same folder, run after run
