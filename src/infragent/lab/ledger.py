"""The ledger: an append-only record of runs, experiments, probe results, feedback, artifacts, environments,
launches, and the hypotheses and candidates of optimize runs, in a SQLite file (WAL; the embedded default) or
on a PostgreSQL server (`--ledger postgresql://...` or $INFRAGENT_LEDGER; several machines and processes
append to it at once). Every write is its own transaction, so a `kill -9` loses at most the probe in flight,
and a run can be resumed from what it has recorded.

Artifacts are kept by content hash under the ledger's home folder (a SQLite ledger's folder; for PostgreSQL,
postgresql-<id of server and database> under $INFRAGENT_HOME or ./.infragent); a PostgreSQL ledger also keeps
their bytes in the database, so a reader on another machine gets them back (artifact_path).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from infragent.lab.ledger_db import (Database, DatabaseError, PostgresDatabase, SQLiteDatabase, is_postgres,
                                     postgres_schema, without_password)

SCHEMA = """
CREATE TABLE IF NOT EXISTS environments (
    id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, data TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, spec_path TEXT, spec_hash TEXT, status TEXT NOT NULL,
    environment_id INTEGER REFERENCES environments(id), target_pgid INTEGER, created REAL NOT NULL,
    updated REAL NOT NULL, note TEXT, candidate_pgid INTEGER, budget TEXT);
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), name TEXT NOT NULL,
    knobs TEXT NOT NULL, created REAL NOT NULL, UNIQUE (run_id, name));
CREATE TABLE IF NOT EXISTS probe_results (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), experiment_id INTEGER REFERENCES experiments(id),
    key TEXT NOT NULL, probe TEXT NOT NULL, verdict TEXT NOT NULL, finding TEXT NOT NULL, numbers TEXT NOT NULL,
    created REAL NOT NULL, UNIQUE (run_id, key));
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY, probe_result_id INTEGER NOT NULL REFERENCES probe_results(id), data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS launches (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), role TEXT NOT NULL, pgid INTEGER NOT NULL,
    port INTEGER, argv TEXT NOT NULL, log_path TEXT, started REAL NOT NULL, stopped REAL, status TEXT NOT NULL,
    note TEXT, node TEXT);
CREATE TABLE IF NOT EXISTS hypotheses (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), key TEXT NOT NULL, claim TEXT NOT NULL,
    probe TEXT NOT NULL, status TEXT NOT NULL, data TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    UNIQUE (run_id, key));
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), trial INTEGER NOT NULL,
    proposer TEXT NOT NULL, hypothesis TEXT, status TEXT NOT NULL, feasible INTEGER NOT NULL, objective REAL,
    why TEXT NOT NULL, data TEXT NOT NULL, created REAL NOT NULL, UNIQUE (run_id, trial));
CREATE TABLE IF NOT EXISTS artifacts (
    id INTEGER PRIMARY KEY, probe_result_id INTEGER REFERENCES probe_results(id), sha256 TEXT NOT NULL,
    path TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS artifact_blobs (sha256 TEXT PRIMARY KEY, content BLOB NOT NULL);
"""


def _postgres_home(url: str) -> Path:
    """This machine's folder for one PostgreSQL database's logs and local copies: one per server and database
    under $INFRAGENT_HOME, so run 1's logs of one ledger never overwrite run 1's of another (or a SQLite
    ledger's in the same folder)."""
    server = without_password(url).split("?")[0]
    base = Path(os.environ.get("INFRAGENT_HOME", ".infragent")).resolve()
    return base / f"postgresql-{hashlib.sha256(server.encode()).hexdigest()[:12]}"


class LedgerError(RuntimeError):
    """A ledger that cannot be opened or a run that does not exist; the message says which."""


class Ledger:
    """One ledger: a SQLite file or a PostgreSQL URL; artifacts are copied under <home>/artifacts/<sha256>."""

    def __init__(self, location: str | Path, readonly: bool = False) -> None:
        self.postgres = is_postgres(location)
        self.path: Path | None = None if self.postgres else Path(location)  # the SQLite file
        self.home = self.path.parent if self.path else _postgres_home(str(location))
        self.artifact_root = self.home / "artifacts"  # with logs, workspaces and reports of this machine's runs
        try:
            if self.postgres:
                self.db: Database = PostgresDatabase(str(location), readonly)
            else:
                if not readonly:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self.db = SQLiteDatabase(self.path, readonly)
            self.location = self.db.location
            if readonly:
                self.db.execute("SELECT COUNT(*) FROM runs").fetchone()
                return
            self.db.script(postgres_schema(SCHEMA) if self.postgres else SCHEMA)
            columns = self.db.columns("runs")
            if "candidate_pgid" not in columns:  # a ledger from before candidates were tracked
                self.db.execute("ALTER TABLE runs ADD COLUMN candidate_pgid INTEGER")
            if "budget" not in columns:  # a ledger from before budgets were recorded
                self.db.execute("ALTER TABLE runs ADD COLUMN budget TEXT")
            if "node" not in self.db.columns("launches"):  # a ledger from before trials ran on Ray nodes
                self.db.execute("ALTER TABLE launches ADD COLUMN node TEXT")
        except DatabaseError as err:
            raise LedgerError(f"{location if not self.postgres else 'PostgreSQL ledger'}: not a usable ledger "
                              f"({err})") from None

    @classmethod
    def existing(cls, location: str | Path, readonly: bool = False) -> "Ledger":
        """A ledger that must already exist and hold a run (readers: report, ui); LedgerError says what is wrong."""
        if not is_postgres(location) and not Path(location).is_file():
            raise LedgerError(f"{location}: no ledger here; `infragent optimize SPEC` or `infragent measure SPEC` "
                              "writes one, or pass --ledger PATH")
        ledger = cls(location, readonly)
        try:
            empty = ledger.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
        except DatabaseError as err:
            raise LedgerError(f"{ledger.location}: not a usable ledger ({err})") from None
        if empty:
            raise LedgerError(f"{ledger.location}: the ledger has no runs yet; `infragent optimize SPEC` records one")
        return ledger

    def _write(self, sql: str, args: tuple) -> None:
        with self._transaction():
            self.db.execute(sql, args)

    def _insert(self, sql: str, args: tuple) -> int:
        """One INSERT in its own transaction; the new row's id."""
        with self._transaction():
            return self.db.insert(sql, args)

    def _transaction(self) -> Any:
        return self.db.transaction()

    def environment(self, data: dict[str, Any]) -> int:
        """Store an environment once (deduplicated by hash); return its id."""
        blob = json.dumps(data, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()
        with self._transaction():
            self.db.execute("INSERT OR IGNORE INTO environments (hash, data, created) VALUES (?, ?, ?)",
                            (digest, blob, time.time()))
            return int(self.db.execute("SELECT id FROM environments WHERE hash = ?", (digest,)).fetchone()[0])

    def start_run(self, kind: str, spec_path: str | None, spec_hash: str | None, environment_id: int | None) -> int:
        """A new run in status 'running'."""
        now = time.time()
        return self._insert("INSERT INTO runs (kind, spec_path, spec_hash, status, environment_id, created, updated) "
                           "VALUES (?, ?, ?, 'running', ?, ?, ?)", (kind, spec_path, spec_hash, environment_id, now, now))

    def run(self, run_id: int) -> dict[str, Any]:
        """One run's row as a dict."""
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.location}: no run {run_id}; `infragent runs` lists them")
        return dict(zip([c[0] for c in self.db.execute("SELECT * FROM runs LIMIT 0").description], row))

    def set_run(self, run_id: int, **fields: Any) -> None:
        """Update status, target_pgid, candidate_pgid or note (status: running, completed, interrupted, failed)."""
        names = ", ".join(f"{k} = ?" for k in fields)
        self._write(f"UPDATE runs SET {names}, updated = ? WHERE id = ?", (*fields.values(), time.time(), run_id))

    def experiment(self, run_id: int, name: str, knobs: dict[str, Any]) -> int:
        """The experiment (knob setting) of a run, created once."""
        with self._transaction():
            self.db.execute("INSERT OR IGNORE INTO experiments (run_id, name, knobs, created) VALUES (?, ?, ?, ?)",
                            (run_id, name, json.dumps(knobs, sort_keys=True), time.time()))
            return int(self.db.execute("SELECT id FROM experiments WHERE run_id = ? AND name = ?",
                                       (run_id, name)).fetchone()[0])

    def experiment_knobs(self, run_id: int, name: str) -> dict[str, Any] | None:
        """The knobs of the run's experiment by that name (None when it has none)."""
        row = self.db.execute("SELECT knobs FROM experiments WHERE run_id = ? AND name = ?", (run_id, name)).fetchone()
        return json.loads(row[0]) if row else None

    def record_probe(self, run_id: int, key: str, feedback: dict[str, Any], experiment_id: int | None = None,
                     artifacts: list[tuple[str, str]] = ()) -> int:
        """Store one completed probe, its Feedback and its artifacts in one transaction (key unique per run)."""
        stored = [self._store_artifact(path, description) for path, description in artifacts]
        numbers = {k: v.get("value") for k, v in feedback.get("numbers", {}).items()}
        with self._transaction():
            pid = self.db.insert(
                "INSERT INTO probe_results (run_id, experiment_id, key, probe, verdict, finding, numbers, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (run_id, experiment_id, key, feedback["probe"], feedback["verdict"],
                                                    feedback["finding"], json.dumps(numbers), time.time()))
            self.db.execute("INSERT INTO feedback (probe_result_id, data) VALUES (?, ?)", (pid, json.dumps(feedback)))
            for sha, path, description, data in stored:
                if self.postgres:  # the bytes travel with the ledger: readers elsewhere share no filesystem
                    self.db.execute("INSERT OR IGNORE INTO artifact_blobs (sha256, content) VALUES (?, ?)",
                                    (sha, data))
                self.db.execute("INSERT INTO artifacts (probe_result_id, sha256, path, description) VALUES (?, ?, ?, ?)",
                                (pid, sha, path, description))
            self.db.execute("UPDATE runs SET updated = ? WHERE id = ?", (time.time(), run_id))
        return pid

    def _store_artifact(self, path: str, description: str) -> tuple[str, str, str, bytes]:
        data = Path(path).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        target = self._artifact_file(sha)
        if not target.exists():
            _put_file(target, data)
        return sha, str(target), description, data

    def put_artifact(self, data: bytes) -> Path:
        """Keep bytes that arrived from elsewhere (a Ray node's artifact) under their hash; the local file."""
        target = self._artifact_file(hashlib.sha256(data).hexdigest())
        if not target.exists():
            _put_file(target, data)
        return target

    def _artifact_file(self, sha: str) -> Path:
        return self.artifact_root / sha[:2] / sha

    def artifact_path(self, sha: str) -> Path:
        """The local file of an artifact by its hash; from a PostgreSQL ledger, fetched here when absent."""
        target = self._artifact_file(sha)
        if target.exists() or not self.postgres:
            return target
        row = self.db.execute("SELECT content FROM artifact_blobs WHERE sha256 = ?", (sha,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.location}: no artifact {sha}")
        _put_file(target, bytes(row[0]))
        return target

    def environment_data(self, environment_id: int | None) -> dict[str, Any] | None:
        """An environment's data by id (None when the run has none)."""
        row = self.db.execute("SELECT data FROM environments WHERE id = ?", (environment_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def close(self) -> None:
        """Close the database connection."""
        self.db.close()

    def record_launch(self, run_id: int, role: str, pgid: int, port: int | None, argv: list[str],
                      log_path: str | None, started: float, node: str | None = None) -> int:
        """A launched process group, recorded before anything waits on it (so a resume can stop it); node: the
        Ray node it ran on (None: this machine)."""
        return self._insert("INSERT INTO launches (run_id, role, pgid, port, argv, log_path, started, status, node) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, 'launched', ?)",
                           (run_id, role, pgid, port, json.dumps(argv), log_path, started, node))

    def set_launch(self, launch_id: int, **fields: Any) -> None:
        """Update a launch's status, stopped time or note."""
        names = ", ".join(f"{k} = ?" for k in fields)
        self._write(f"UPDATE launches SET {names} WHERE id = ?", (*fields.values(), launch_id))

    def launches(self, run_id: int) -> list[dict[str, Any]]:
        """Every process group a run launched, oldest first."""
        cursor = self.db.execute("SELECT * FROM launches WHERE run_id = ? ORDER BY id", (run_id,))
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row), argv=json.loads(row[names.index("argv")])) for row in cursor.fetchall()]

    def record_hypothesis(self, run_id: int, key: str, data: dict[str, Any]) -> None:
        """Store a hypothesis (claim, locality, the probe that can refute it, prediction, status, what it cites),
        or update it as its status changes (open → supported | refuted | inconclusive)."""
        now = time.time()
        self._write("INSERT INTO hypotheses (run_id, key, claim, probe, status, data, created, updated) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, key) DO UPDATE SET claim = excluded.claim, "
                    "probe = excluded.probe, status = excluded.status, data = excluded.data, updated = excluded.updated",
                    (run_id, key, data["claim"], data["probe"], data.get("status", "open"), json.dumps(data), now, now))

    def hypotheses(self, run_id: int) -> list[dict[str, Any]]:
        """A run's hypotheses in the order they were posed, each as it now stands."""
        rows = self.db.execute("SELECT data FROM hypotheses WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def record_candidate(self, run_id: int, trial: int, data: dict[str, Any]) -> None:
        """A candidate's outcome (knobs and/or patch, the hypothesis it tests, status, verdict, why, the probe
        records it cites): what a resumed run replays."""
        self._write("INSERT INTO candidates (run_id, trial, proposer, hypothesis, status, feasible, objective, why, "
                    "data, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, trial, data.get("proposer", "search"), data.get("hypothesis"), data["status"],
                     int(bool(data.get("feasible"))), data.get("objective"), data.get("why", ""),
                     json.dumps(data, default=str), time.time()))

    def candidates(self, run_id: int) -> list[dict[str, Any]]:
        """A run's candidates in trial order."""
        rows = self.db.execute("SELECT data FROM candidates WHERE run_id = ? ORDER BY trial", (run_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def completed_keys(self, run_id: int) -> set[str]:
        """Keys of the probes a run has recorded."""
        return {k for (k,) in self.db.execute("SELECT key FROM probe_results WHERE run_id = ?", (run_id,))}

    def probe_results(self, run_id: int) -> list[dict[str, Any]]:
        """A run's probe results, oldest first, with their feedback."""
        rows = self.db.execute("SELECT p.id, p.key, p.probe, p.verdict, p.finding, p.numbers, p.created, f.data "
                               "FROM probe_results p JOIN feedback f ON f.probe_result_id = p.id "
                               "WHERE p.run_id = ? ORDER BY p.id", (run_id,)).fetchall()
        return [{"id": r[0], "key": r[1], "probe": r[2], "verdict": r[3], "finding": r[4],
                 "numbers": json.loads(r[5]), "created": r[6], "feedback": json.loads(r[7])} for r in rows]

    def runs(self) -> list[dict[str, Any]]:
        """Every run with its probe count and note, newest first."""
        rows = self.db.execute("SELECT r.id, r.kind, r.status, r.spec_path, r.created, COUNT(p.id), r.note FROM runs r "
                               "LEFT JOIN probe_results p ON p.run_id = r.id GROUP BY r.id ORDER BY r.id DESC")
        return [{"id": r[0], "kind": r[1], "status": r[2], "spec": r[3], "created": r[4], "probes": r[5], "note": r[6]}
                for r in rows]

    def export_jsonl(self) -> Iterator[str]:
        """Every run with its environment, launches and probe results, one JSON object per line."""
        for run in reversed(self.runs()):
            row = self.run(run["id"])
            yield json.dumps({"run": row, "environment": self.environment_data(row["environment_id"]),
                              "launches": self.launches(run["id"]), "hypotheses": self.hypotheses(run["id"]),
                              "candidates": self.candidates(run["id"]), "probes": self.probe_results(run["id"])})


def charged(feedback: dict[str, Any]) -> bool:
    """Whether a probe record counts against a run's probe budget (the raw records of a charged probe do not)."""
    return feedback.get("details", {}).get("charged", True) is not False


def _put_file(target: Path, data: bytes) -> None:
    """Write data to target atomically: a crash never leaves a half-written artifact under its hash."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
