"""What every command group shares: the typer app, failing with a message, printing a probe's Feedback, resolving
module:function names and inputs factories, and the ledger's path."""
from __future__ import annotations

import os

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="infragent: an infrastructure agent for LLM inference, and the engine it tunes.")


def fail(message: str) -> None:
    """Print the error and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def emit(feedback, as_json: bool, verbose: bool = False, html: str | None = None) -> None:
    """Print a probe's Feedback (JSON or text; compact unless verbose) and exit 1 when its verdict is fail;
    html: also draw it as a page there (charts of its raw evidence)."""
    from infragent.probes.compact import compact_json, render_compact

    if html:
        from infragent.report.probe_page import write_probe_page

        try:
            typer.echo(f"html: {write_probe_page(feedback, html)}", err=True)
        except OSError as err:
            fail(f"--html {html}: {err.strerror}")
    if verbose:
        typer.echo(feedback.to_json() if as_json else feedback.render())
    else:
        typer.echo(compact_json(feedback) if as_json else render_compact(feedback))
    if feedback.verdict == "fail":
        raise typer.Exit(1)


INPUTS_STYLE_HELP = ("trial: the factory is called as factory(trial, generator); seed: as factory(seed), one int "
                     "per trial.")


def make_inputs(name: str, style: str, what: str = "--inputs"):
    """An inputs factory from module:function, adapted to its style (probes/inputs.inputs_factory)."""
    from infragent.probes.inputs import InputsError, inputs_factory

    try:
        return inputs_factory(resolve(name, what), style, what)
    except InputsError as err:
        fail(str(err))


def resolve(name: str, what: str):  # noqa: ANN201 - the resolved callable
    """The callable named module:function (an error names `what` and exits)."""
    from infragent.probes.callables import CallableError, resolve

    try:
        return resolve(name, what)
    except CallableError as err:
        fail(str(err))


DEFAULT_LEDGER = os.environ.get("INFRAGENT_LEDGER") or ".infragent/ledger.sqlite"  # a file, or postgresql://...


def ledger_file(ledger: str, export_artifacts: bool = False) -> str:
    """The ledger file as an absolute path, fixed once where the command starts: the loops start children in
    other folders (kernel gates in a pack or a worktree), where a relative path would point somewhere else.
    A PostgreSQL URL is returned as it is. export_artifacts: also fix the probes' artifact folder
    ($INFRAGENT_ARTIFACTS, absolute) for children."""
    from pathlib import Path

    from infragent.lab.ledger_db import is_postgres

    if export_artifacts:
        from infragent.probes.artifacts import export_artifact_dir

        export_artifact_dir()
    if is_postgres(ledger):
        os.environ.setdefault("INFRAGENT_HOME", str(Path(".infragent").resolve()))  # children keep this folder
        return ledger
    return str(Path(ledger.removeprefix("sqlite://")).expanduser().resolve())
