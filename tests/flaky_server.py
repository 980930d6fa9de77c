"""A black-box OpenAI server for the command-target tests: `infragent serve`, misbehaving on request.

    python tests/flaky_server.py --behaviour ok|exit-after-ready|hang-after-ready|no-bind --port P [serve args]

ok               execs `infragent serve --port P ...`
exit-after-ready serves until ready, then 2 s later stops the server and exits
hang-after-ready serves until ready, then 2 s later freezes the server (SIGSTOP): it answers nothing
no-bind          a decoy in another session holds P and answers /health; this process never binds
                 (the decoy's pid goes to $FLAKY_DECOY_PIDS, one per line, for the test to stop)
"""
from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import time

import httpx


def serve_argv(port: str, rest: list[str]) -> list[str]:
    """The real server's command line."""
    return [sys.executable, "-m", "infragent.cli", "serve", "--port", port, *rest]


def wait_ready(port: str) -> None:
    """Until the server answers /health."""
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


class Health(http.server.BaseHTTPRequestHandler):
    """Answers 200 to anything: a server that is not the one launched."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    """Run the requested behaviour."""
    args = sys.argv[1:]
    behaviour = args[args.index("--behaviour") + 1]
    port = args[args.index("--port") + 1]
    rest = [a for i, a in enumerate(args) if a not in ("--behaviour", "--port")
            and (i == 0 or args[i - 1] not in ("--behaviour", "--port"))]
    if behaviour == "ok":
        os.execv(sys.executable, serve_argv(port, rest))
    if behaviour == "decoy":
        http.server.HTTPServer(("127.0.0.1", int(port)), Health).serve_forever()
    if behaviour == "no-bind":
        decoy = subprocess.Popen([sys.executable, __file__, "--behaviour", "decoy", "--port", port],
                                 start_new_session=True)
        with open(os.environ["FLAKY_DECOY_PIDS"], "a") as pids:
            pids.write(f"{decoy.pid}\n")
        print(f"cannot bind port {port}: address already in use; waiting anyway", flush=True)
        time.sleep(3600)
    server = subprocess.Popen(serve_argv(port, rest))
    wait_ready(port)
    time.sleep(2)
    if behaviour == "exit-after-ready":
        server.terminate()
        server.wait()
        print("exiting after readiness", flush=True)
        sys.exit(3)
    os.kill(server.pid, signal.SIGSTOP)
    print("frozen", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
