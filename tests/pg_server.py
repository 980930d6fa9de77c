"""A real PostgreSQL server for the tests, started from the machine's own binaries (initdb, pg_ctl) into a
temporary folder, listening on a Unix socket only; as root, it runs as the `postgres` (else `nobody`) user.
A test that cannot get one is skipped with the reason."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator


def unavailable() -> str | None:
    """Why no server can be started here (None: it can)."""
    missing = [tool for tool in ("initdb", "pg_ctl") if shutil.which(tool) is None]
    if missing:
        return f"no PostgreSQL here ({', '.join(missing)} not on PATH; Debian: apt-get install postgresql)"
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg 3 is not installed (pip install 'infragent[postgres]')"
    return None


def _as_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix and ids to run the server as: PostgreSQL refuses to run as root."""
    if os.geteuid() != 0:
        return [], None, None
    for name in ("postgres", "nobody"):
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        return ["runuser", "-u", name, "--"], user.pw_uid, user.pw_gid
    raise RuntimeError("running as root with neither a postgres nor a nobody user to run PostgreSQL as")


@contextlib.contextmanager
def postgres_server(fsync: bool = False) -> Iterator[str]:
    """Start a throwaway server; yield a URL for its database `postgres` (user infragent, trust auth). fsync:
    make commits durable, as a real server does (off for tests: faster, and the tests do not pull the plug)."""
    prefix, uid, gid = _as_user()
    root = Path(tempfile.mkdtemp(prefix="infragent-pg-"))
    os.chmod(root, 0o755)
    data, sockets, log = root / "data", root / "sockets", root / "server.log"
    sockets.mkdir()
    if uid is not None:
        for path in (root, sockets):
            os.chown(path, uid, gid)
    try:
        subprocess.run([*prefix, "initdb", "-D", str(data), "-U", "infragent", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True, text=True, timeout=120)
        options = f"-c listen_addresses='' -k {sockets} -c fsync={'on' if fsync else 'off'} -c max_connections=40"
        started = subprocess.run([*prefix, "pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w",
                                  "-t", "60", "start"], capture_output=True, text=True, timeout=120)
        if started.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}{log.read_text() if log.exists() else ''}")
        yield f"postgresql://infragent@/postgres?host={sockets}"
    finally:
        if data.exists():
            subprocess.run([*prefix, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                           timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server at url; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.replace("/postgres?", f"/{name}?", 1)
