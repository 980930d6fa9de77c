"""Run the server with uvicorn: loopback by default, graceful shutdown on SIGTERM within a bound."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import uvicorn

from infragent.engine.config import EngineConfig
from infragent.engine.disagg.router import DisaggConfig, DisaggEngine
from infragent.engine.server.app import MAX_REQUEST_BYTES, build_app
from infragent.engine.server.async_engine import AsyncEngine


class Server(uvicorn.Server):
    """uvicorn's Server, except that after a graceful SIGTERM/SIGINT shutdown the process exits with status 0
    (uvicorn re-raises the signal once it has shut down, which ends the process with -15)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals only reach the main thread; a server run in a thread is stopped via should_exit
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(config: EngineConfig, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                max_waiting: int = 256, shutdown_timeout_s: float = 30.0, model_name: str | None = None,
                log_level: str = "warning", disagg: DisaggConfig | None = None,
                max_request_bytes: int = MAX_REQUEST_BYTES, profile_dir: str | None = None) -> Server:
    """A uvicorn Server (call .run(), or run it in a thread and set .should_exit) serving the engine, or with
    disagg a router in front of prefill and decode worker processes."""
    engine = (DisaggEngine(config, disagg, max_waiting=max_waiting) if disagg is not None
              else AsyncEngine(config, max_waiting=max_waiting, profile_dir=profile_dir))
    app = build_app(engine, model_name or config.model, api_key, max_request_bytes)
    # On SIGTERM uvicorn stops accepting, waits up to shutdown_timeout_s for in-flight requests, exits 0.
    return Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                         timeout_graceful_shutdown=shutdown_timeout_s, access_log=False))
