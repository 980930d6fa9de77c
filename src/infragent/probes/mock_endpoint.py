"""An instant OpenAI-compatible streaming endpoint on raw asyncio, for measuring loadgen's own overhead.

It answers every POST at once with a completion of `tokens` one-token chunks, a usage chunk and [DONE],
over keep-alive HTTP/1.1 with chunked encoding, so that any latency loadgen reports is loadgen's.
"""
from __future__ import annotations

import asyncio
import functools
import json

import msgspec


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@functools.lru_cache(maxsize=1024)
def streamed_completion(tokens: int, prompt_tokens: int) -> bytes:
    """The whole chunked SSE body of one completion."""
    events = []
    for i in range(tokens):
        finish = "length" if i == tokens - 1 else None
        events.append({"id": "cmpl-mock", "object": "text_completion", "model": "mock",
                       "choices": [{"index": 0, "text": " x", "finish_reason": finish}]})
    events.append({"id": "cmpl-mock", "object": "text_completion", "model": "mock", "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                             "total_tokens": prompt_tokens + tokens}})
    body = b"".join(_chunk(b"data: " + json.dumps(e).encode() + b"\n\n") for e in events)
    return body + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"connection: keep-alive\r\n\r\n")
MODELS = json.dumps({"object": "list", "data": [{"id": "mock", "object": "model"}]}).encode()


async def serve_mock(host: str = "127.0.0.1", port: int = 0, tokens: int = 4,
                     log: list[tuple[str, int]] | None = None, name: str = "mock") -> asyncio.AbstractServer:
    """Start the mock server; its port is server.sockets[0].getsockname()[1].

    With log, each completion request appends (name, prompt length) to it, in arrival order.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET /v1/models"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(MODELS), MODELS))
                    continue
                request = msgspec.json.decode(body or b"{}")
                prompt = request.get("prompt", [])
                out = int(request.get("max_tokens") or tokens)
                if log is not None:
                    log.append((name, len(prompt) if isinstance(prompt, list) else 1))
                writer.write(HEAD + streamed_completion(out, len(prompt) if isinstance(prompt, list) else 1))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # client gone, or the loop is shutting down
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
