"""The infragent command line: one typer app, its commands by group (engine, probes, lab, agent)."""
from __future__ import annotations

import sys
from typing import Any

from infragent.cli import engine, probes, lab, agent  # each registers its commands on app, in this order
from infragent.cli.common import app
from infragent.cli.engine import generate, serve
from infragent.cli.probes import quality

__all__ = ["app", "main", "generate", "serve", "quality", "agent", "engine", "lab", "probes"]


def main() -> None:
    """The console entry: a command ended by an interrupt exits 130, and an interrupt still pending while the
    process unwinds cannot turn that exit into a bare KeyboardInterrupt (a SIGINT death)."""
    import signal

    try:
        app()
        code: Any = 0
    except KeyboardInterrupt:
        code = 130
    except SystemExit as done:
        code = done.code
    if code == 130:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
