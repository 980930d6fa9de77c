"""A run's life in the ledger: opened (or resumed), every target it launches recorded before anything waits
on it, and its end marked — completed, interrupted (SIGINT/SIGTERM) or failed, with the reason — so
`--resume` can stop what an earlier process left behind and continue.
"""
from __future__ import annotations

import contextlib
import hashlib
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from infragent.lab import environment
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Target
from infragent.lab.target import TargetDied, TargetError, TargetProcess, held_signals, stop_group

def interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C (KeyboardInterrupt), so every target the process launched is stopped."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def open_run(ledger: Ledger, kind: str, spec_path: str | Path, resume: int | None,
             log: Callable[[str], None]) -> int:
    """A new run in the ledger, or an earlier one to continue (interrupted, failed, or completed and given more
    budget): same spec (by hash) required, and every process group an earlier process left behind is stopped
    first."""
    spec_hash = hashlib.sha256(Path(spec_path).read_bytes()).hexdigest()
    if resume is None:
        return ledger.start_run(kind, str(spec_path), spec_hash, ledger.environment(environment.capture()))
    row = ledger.run(resume)
    if row["spec_hash"] != spec_hash:
        raise ValueError(f"run {resume} was made from a different spec (hash {row['spec_hash'][:12]}); "
                         "resume it with the same file")
    stop_orphans(ledger, resume, log)
    ledger.set_run(resume, status="running", note=None)
    return resume


def stop_orphans(ledger: Ledger, run_id: int, log: Callable[[str], None]) -> None:
    """Stop every process group of the run that the ledger does not show as stopped."""
    row = ledger.run(run_id)
    for column in ("target_pgid", "candidate_pgid"):  # ledgers written before launches were recorded
        if row.get(column) and stop_group(row[column], grace_s=5):
            log(f"stopped the process group {row[column]} ({column}) left by the interrupted run")
    for launch in ledger.launches(run_id):
        if launch["stopped"] is None and launch.get("node") is None:  # a Ray node's launches: its guardian's
            if stop_group(launch["pgid"], grace_s=5, started_after=launch["started"]):
                log(f"stopped the process group {launch['pgid']} ({launch['role']}, port {launch['port']}) "
                    "left by the interrupted run")
            ledger.set_launch(launch["id"], stopped=time.time(), status="stopped by resume")


@contextlib.contextmanager
def guarded_run(ledger: Ledger, run_id: int, resume_hint: str,
                log: Callable[[str], None] = print) -> Iterator[None]:
    """Mark the run interrupted or failed, with the reason, when the block ends by a signal or an error."""
    try:
        yield
    except KeyboardInterrupt as err:
        _mark(ledger, run_id, "interrupted", f"interrupted ({err or 'signal 2'})", resume_hint, log)
        raise
    except Exception as err:
        _mark(ledger, run_id, "failed", f"{type(err).__name__}: {str(err)[:500]}", resume_hint, log)
        raise


def _mark(ledger: Ledger, run_id: int, status: str, why: str, resume_hint: str, log: Callable[[str], None]) -> None:
    note = f"{why}; every target it launched was stopped; continue with {resume_hint} --resume {run_id}"
    with held_signals():
        ledger.set_run(run_id, status=status, note=note)
    log(f"run {run_id} {status}: {note}")


@contextlib.contextmanager
def launched(target: Target, knobs: dict[str, Any], ledger: Ledger, run_id: int, role: str,
             code: Path | None = None, wait: bool = True) -> Iterator[TargetProcess]:
    """A target process recorded in the ledger (group, port, argv) before its readiness wait, stopped and
    marked so on the way out; the launch's status says whether it was ready, died or never became ready.
    code: a copy of the target's code to launch from (lab/target.code_environment). wait=False yields it
    spawned, not yet ready: the caller waits with proc.ready() (several launches then load in parallel)."""
    log_path = ledger.home / "logs" / f"run-{run_id}-{role.replace('/', '-')}.log"
    ids: list[int] = []

    def record(proc: TargetProcess) -> None:
        with held_signals():  # recorded means known here too: an interrupt lands after, and the launch is marked
            ids.append(ledger.record_launch(run_id, role, proc.pgid, proc.port, proc.argv, str(proc.log_path),
                                            proc.started_at))

    proc = TargetProcess(target, knobs, log_path, on_launch=record, code=code,
                         on_ready=lambda _: ledger.set_launch(ids[0], status="ready"))
    status = "stopped"
    try:
        try:
            proc.spawn()
            if wait:
                proc.ready()
        except TargetError as err:
            status = f"not ready: {str(err)[:200]}"
            raise
        yield proc
    except TargetDied as err:
        status = f"died: {str(err)[:200]}"
        raise
    except TargetError as err:  # a launch yielded unready that never became ready
        status = f"not ready: {str(err)[:200]}" if not proc.is_ready else f"failed: {str(err)[:200]}"
        raise
    except KeyboardInterrupt:
        status = "stopped by interrupt"
        raise
    finally:
        if status == "stopped" and not proc.is_ready:
            status = "stopped before it was ready"
        with held_signals():  # stopped and recorded as stopped, whatever arrives meanwhile
            proc.stop()
            if ids:
                ledger.set_launch(ids[0], stopped=time.time(), status=status)
