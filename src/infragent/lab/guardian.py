"""A guardian for the process groups a process launches: a small watcher process, in a session of its own,
that reads the groups to guard from a pipe and stops every one still guarded once the pipe closes. The pipe
closes when the launching process exits by any route (SIGKILL, a lost Ray node's worker torn down), so
targets launched on a node never outlive the trial that launched them.

Protocol on the watcher's stdin, one line each: "+ PGID STARTED" (guard), "- PGID" (stopped by its owner).
"""
from __future__ import annotations

import contextlib
import subprocess
import sys


class Guardian:
    """The launching side: register groups as they start and release them as they are stopped."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "infragent.lab.guardian"], stdin=subprocess.PIPE,
                                     start_new_session=True, text=True)

    def guard(self, pgid: int, started: float) -> None:
        """Stop this group if the launching process dies before it releases it."""
        self._send(f"+ {pgid} {started}")

    def release(self, pgid: int) -> None:
        """The group was stopped by its owner: nothing left to guard."""
        self._send(f"- {pgid}")

    def close(self) -> None:
        """Close the pipe (whatever is still guarded is stopped) and wait for the watcher."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]


def main() -> None:
    """The watcher: guard groups until stdin closes, then stop the ones never released."""
    from infragent.lab.target import stop_group

    guarded: dict[int, float] = {}
    for line in sys.stdin:
        sign, pgid, *rest = line.split()
        if sign == "+":
            guarded[int(pgid)] = float(rest[0])
        else:
            guarded.pop(int(pgid), None)
    for pgid, started in guarded.items():
        stop_group(pgid, grace_s=5.0, started_after=started)


if __name__ == "__main__":
    main()
