"""The lab's commands: measure a spec's baseline, list and show the ledger's runs, write a run's report."""
from __future__ import annotations

from typing import Optional

import typer

from infragent.cli.common import DEFAULT_LEDGER, app, fail, ledger_file

@app.command()
def measure(
    spec: str = typer.Argument(..., help="The spec TOML."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger", help="The ledger: a SQLite file, or postgresql://... ($INFRAGENT_LEDGER)."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue an interrupted run by its id."),
) -> None:
    """Measure the spec's target on every scenario (baseline), recording each probe in the ledger."""
    from infragent.lab.ledger import Ledger, LedgerError
    from infragent.lab.measure import measure as run_measure
    from infragent.lab.spec import SpecError
    from infragent.lab.target import TargetError

    from infragent.lab.lifecycle import interrupt_on_sigterm

    interrupt_on_sigterm()
    try:
        run_id = run_measure(spec, Ledger(ledger_file(ledger, export_artifacts=True)), resume,
                             log=lambda line: typer.echo(line, err=True))
    except (SpecError, LedgerError, TargetError, ValueError) as err:
        fail(str(err))
        return
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # the run's note (what was stopped, how to resume) is already printed
    typer.echo(run_id)


@app.command()
def runs(
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    export: Optional[str] = typer.Option(None, "--export", help="Write every run as JSONL to this file."),
) -> None:
    """List the ledger's runs (or export them as JSONL)."""
    import time as _time

    from infragent.lab.ledger import Ledger, LedgerError

    try:
        book = Ledger(ledger_file(ledger))
    except LedgerError as err:
        fail(str(err))
        return
    if export:
        with open(export, "w") as f:
            for line in book.export_jsonl():
                f.write(line + "\n")
        return
    for run in book.runs():
        when = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(run["created"]))
        typer.echo(f"{run['id']:5d}  {when}  {run['kind']:8s} {run['status']:11s} {run['probes']:4d} probes  {run['spec']}"
                   + (f"\n       {run['note']}" if run.get("note") and run["status"] != "completed" else ""))


@app.command()
def show(
    run_id: int = typer.Argument(..., help="Run id (see `infragent runs`)."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show one run: its status and every recorded probe's verdict and finding."""
    import json as _json

    from infragent.lab.ledger import Ledger, LedgerError

    try:
        book = Ledger(ledger_file(ledger))
        row = book.run(run_id)
    except LedgerError as err:
        fail(str(err))
        return
    results = book.probe_results(run_id)
    from infragent.lab.criteria import describe

    from infragent.lab.trajectory import chains

    launches = book.launches(run_id)
    hypotheses = chains(book, run_id)
    candidates = book.candidates(run_id)
    if as_json:
        typer.echo(_json.dumps({"run": row, "launches": launches, "hypotheses": hypotheses, "candidates": candidates,
                                "probes": results}, indent=2))
        return
    typer.echo(f"run {run_id}: {row['kind']} {row['status']} spec={row['spec_path']}")
    if row.get("note"):
        typer.echo(f"  note: {row['note']}")
    for launch in launches:
        typer.echo(f"  launch {launch['role']:16s} process group {launch['pgid']}, port {launch['port']}: "
                   f"{launch['status']}")
    for r in results:
        typer.echo(f"  {r['key']:24s} [{r['probe']}] {r['verdict'].upper()}: {r['finding']}")
        for j in r["feedback"].get("details", {}).get("judgements", []):
            if j.get("metric") and "ci" in j:
                typer.echo(f"      {j['verdict'].upper():12s} {j['metric']} [{j.get('phase')}, bucket "
                           f"{j.get('bucket')}] {describe(j)}")
    if hypotheses:
        typer.echo("hypotheses (hypothesis -> probe -> verdict -> decision):")
    for h in hypotheses:
        probe = (f"{h['settled_by']} {h['probe_verdict'].upper()}" if h["settled_by"] and h["probe_verdict"]
                 else f"{h['probe']} (not run on the baseline)")
        typer.echo(f"  {h['key']:14s} {h['claim']}\n      -> {probe} -> {h['status'].upper()} -> {h['decision']}")
    for c in candidates:
        accepted = c["status"] == "measured" and c["feasible"]
        typer.echo(f"  candidate trial/{c['trial']} ({c.get('proposer', 'search')}"
                   + (f", tests {c['hypothesis']}" if c.get("hypothesis") else "") + "): "
                   + ("ACCEPTED" if accepted else c["status"].upper()) + f": {c['why'][:300]}")


@app.command()
def report(
    run_id: int = typer.Argument(..., help="Run id (see `infragent runs`)."),
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="HTML file (default: run-ID.html)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="A Chrome trace to show a timeline excerpt from."),
) -> None:
    """Write one self-contained HTML report of a run (offline: no network, charts inline)."""
    from infragent.lab.ledger import Ledger, LedgerError
    from infragent.report.run_page import write_report
    from infragent.trace_model import TraceFormatError

    try:
        path = write_report(Ledger.existing(ledger_file(ledger)), run_id, output or f"run-{run_id}.html", trace)
    except (LedgerError, TraceFormatError) as err:
        fail(str(err))
        return
    except OSError as err:
        fail(f"{err.filename or output}: {err.strerror}")
        return
    typer.echo(path)


@app.command()
def ui(
    ledger: str = typer.Option(DEFAULT_LEDGER, "--ledger", help="The ledger: a SQLite file, sqlite:///PATH or postgresql://..."),
    port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require this key on every request (Bearer "
                                          "header, or open /?key=KEY once in a browser)."),
) -> None:
    """Serve a read-only dashboard of the ledger on loopback: runs, each run's report, a run in progress live."""
    import socket

    import uvicorn

    from infragent.lab.ledger import Ledger, LedgerError
    from infragent.ui.app import build_ui

    if "://" in ledger and not ledger.startswith(("sqlite:///", "postgresql://", "postgres://")):
        fail(f"--ledger {ledger}: give a SQLite file path, sqlite:///PATH or a postgresql:// URL")
        return
    path = ledger_file(ledger)
    try:
        Ledger.existing(path, readonly=True)
    except LedgerError as err:
        fail(str(err))
        return
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as err:
        fail(f"--port {port}: {err.strerror}; pick another port or 0 for any free one")
        return
    listener.listen(128)  # connections wait in the backlog while the app starts, never refused
    typer.echo(f"infragent ui: http://127.0.0.1:{listener.getsockname()[1]}/ (ledger {path})", err=True)
    config = uvicorn.Config(build_ui(path, api_key), log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])
