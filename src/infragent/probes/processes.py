"""Which processes serve a URL: the listener of a TCP port, a process's group, the members of a group, and
whether a pid given by a user is that server (probes and the target runner both ask)."""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import psutil


class NotTheServer(ValueError):
    """A pid or process group that does not own the server's listening socket."""


def port_of(url: str) -> int:
    """The TCP port a URL points at."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def is_local(url: str) -> bool:
    """Whether the URL's host is this machine (its processes can be read)."""
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127.")


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on this TCP port (None when nobody visible to us listens)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def group_of(pid: int) -> int | None:
    """A process's group id, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def alive(pid: int) -> bool:
    """Whether a process still runs (a zombie waiting for its parent to read its exit status does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[int]:
    """The live pids of a process group, lowest first."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        if group_of(proc.info["pid"]) == pgid:
            members.append(proc.info["pid"])
    return sorted(members)


def describe(pid: int) -> str:
    """'pid 123 (python -m infragent serve ...)', the command line cut to 80 characters."""
    try:
        line = " ".join(" ".join(psutil.Process(pid).cmdline()).split()) or psutil.Process(pid).name()  # one line
    except psutil.Error:
        return f"pid {pid} (gone)"
    return f"pid {pid} ({line[:77] + '...' if len(line) > 80 else line})"


def tree(pid: int) -> list[int]:
    """A process and its descendants (a server's workers), the process first; [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.Error:
        return []


def server_processes(base_url: str, pid: int | None = None, pgid: int | None = None) -> list[int]:
    """The pids that serve base_url, the one holding its listening socket first: the given pid (the listener or
    one of its workers) and its tree, or the given group; without either, the listener and its workers when
    the server is on this machine ([] when it is remote or unseen). Raises NotTheServer when the pid or group
    given is not the server behind that port."""
    port = port_of(base_url)
    owner = listener_pid(port) if is_local(base_url) else None
    if pid is None and pgid is None:
        return tree(owner) if owner is not None else []
    asked = f"--pid {pid}" if pid is not None else f"--pgid {pgid}"
    if pid is not None and not psutil.pid_exists(pid):
        raise NotTheServer(f"{asked}: no such process; give the pid of the server behind {base_url}"
                           + (f" ({describe(owner)} listens on port {port})" if owner else ""))
    if owner is None:
        if is_local(base_url):
            raise NotTheServer(f"{asked}: nothing this user can see listens on port {port}; is {base_url} the "
                               "server's URL?")
        return tree(pid) if pid is not None else group_members(pgid)
    if pid is not None:
        served = tree(owner)
        if pid not in served:
            raise NotTheServer(f"{asked}: {describe(pid)} does not serve port {port}; {describe(owner)} listens "
                               f"there: pass --pid {owner}")
        return served
    if group_of(owner) != pgid:
        raise NotTheServer(f"{asked}: group {pgid} does not serve port {port}; {describe(owner)} listens there "
                           f"(group {group_of(owner)}): pass --pgid {group_of(owner)}")
    return [owner] + [p for p in group_members(pgid) if p != owner]
