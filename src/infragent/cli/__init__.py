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
    process unwinds (a signal held while targets stopped, delivered late) cannot turn that exit into a bare
    KeyboardInterrupt (a SIGINT death): one raised while the first is being handled lands in the outer
    handler, and SIGINT is ignored from the moment the exit status is known."""
    import logging
    import os
    import signal

    code: Any = 130
    try:
        try:
            app()
            code = 0
        except SystemExit as done:
            code = done.code
    except KeyboardInterrupt:
        pass  # code is still 130
    try:
        if code == 130:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130:  # nothing left to run: no interpreter teardown in which a late interrupt could surface
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)
