"""Run a function in a forked child while the parent works, and collect what it returned or raised.

The child shares the parent's memory copy-on-write (a mapped trace file, its raw event slices), sends its
result back pickled through a pipe, and exits without running the parent's cleanup.
"""
from __future__ import annotations

import os
import pickle
from typing import Any, Callable


def start_in_child(work: Callable[[], Any]) -> Callable[[], Any]:
    """Fork and run work() in the child; the returned join() waits and gives its result, or raises its error
    (errors that do not pickle come back as RuntimeError with their repr). Call join() exactly once."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            payload, status = pickle.dumps(("ok", work()), protocol=5), 0
        except BaseException as err:  # noqa: BLE001 - anything goes back to the parent
            try:
                payload = pickle.dumps(("error", err))
            except Exception:  # noqa: BLE001
                payload = pickle.dumps(("error", RuntimeError(repr(err))))
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        os._exit(status)
    os.close(write_end)

    def join() -> Any:
        with os.fdopen(read_end, "rb") as inp:
            received = inp.read()
        os.waitpid(pid, 0)
        status, value = pickle.loads(received)
        if status == "error":
            raise value
        return value

    return join
