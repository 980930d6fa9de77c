"""BodyLimit: an ASGI middleware answering 413 to a request body past the limit, before the app reads it.

The body is read and dropped (up to DRAIN_FACTOR times the limit) so that the client, still sending, gets
the answer instead of a reset connection, and the connection stays usable; a body larger than that is
answered with `Connection: close`.
"""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from infragent.engine.server.protocol import error_body

DRAIN_FACTOR = 16

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    """Wrap an ASGI app: an HTTP request whose body exceeds max_bytes gets OpenAI's error body with 413."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int,
                 on_refused: Callable[[], None] = lambda: None) -> None:
        self.app, self.max_bytes, self.on_refused = app, max_bytes, on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(receive, send, int(declared))
            return
        seen = 0
        started = too_large = whole = False

        async def counted() -> dict[str, Any]:
            nonlocal seen, too_large, whole
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.max_bytes:  # the app sees the client leave (an exception it raised would
                    too_large = True       # become its own 400); the 413 goes out below
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if too_large and not started:
                return  # the app's answer to a body it never got whole: ours goes out instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await self._refuse(receive, send, seen, more=True, ended=whole)

    async def _refuse(self, receive: Receive, send: Send, size: int, more: bool = False,
                      ended: bool = False) -> None:
        """Drain what is left of the body (ended: nothing is), then answer 413."""
        self.on_refused()
        drained = 0
        while not ended and drained <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                break
            drained += len(message.get("body", b""))
            ended = not message.get("more_body", False)
        shown = f"{size} bytes" if not more else f"more than {self.max_bytes} bytes"
        body = json.dumps(error_body(f"request body: {shown} is past this server's limit of {self.max_bytes} "
                                     "bytes (--max-request-bytes); send a smaller body", param="body",
                                     code="request_too_large")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if not ended:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
