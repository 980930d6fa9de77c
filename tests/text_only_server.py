"""An OpenAI-compatible front with llama-cpp-python's server conventions, over our real server: `prompt` must be
a string (a token-id list gets HTTP 422 with a pydantic-style message, as llama-cpp-python 0.3 answers it), and
the stream carries no `usage` (stream_options is ignored). Generation is the real engine's behind it.

    with text_only_front(upstream_url) as url: ...
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import httpx
import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from server_fixture import free_port, in_thread


def front_app(upstream: str, refuse: int | None = None) -> FastAPI:
    """The app: checks prompts as llama-cpp-python does, forwards the rest, strips usage from streams; with
    refuse, every completion gets that status (an overloaded or broken server)."""
    app = FastAPI()
    client = httpx.AsyncClient(base_url=upstream, timeout=120)

    @app.get("/health")
    async def health() -> Response:
        answer = await client.get("/health")
        return Response(answer.content, answer.status_code)

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await client.get("/v1/models")
        return Response(answer.content, answer.status_code, media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        if refuse is not None:
            return JSONResponse({"error": {"message": "the model is not loaded", "code": refuse}}, status_code=refuse)
        if not isinstance(body.get("prompt"), str):
            return JSONResponse({"detail": [{"type": "string_type", "loc": ["body", "prompt"],
                                             "msg": "Input should be a valid string", "input": body.get("prompt")}]},
                                status_code=422)
        body.pop("stream_options", None)
        if not body.get("stream"):
            answer = await client.post("/v1/completions", json=body)
            data = answer.json()
            data.pop("usage", None)
            return JSONResponse(data, answer.status_code)

        async def relay() -> Iterator[bytes]:
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        data = msgspec.json.decode(line[5:].strip())
                        data.pop("usage", None)
                        if not data.get("choices"):
                            continue
                        line = "data: " + msgspec.json.encode(data).decode()
                    if line:
                        yield (line + "\n\n").encode()

        return StreamingResponse(relay(), media_type="text/event-stream")

    return app


@contextlib.contextmanager
def text_only_front(upstream: str, refuse: int | None = None) -> Iterator[str]:
    """Serve the front on a free port in a thread; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(front_app(upstream, refuse), host="127.0.0.1", port=port, log_level="warning"))
    with in_thread(server, port) as url:
        yield url
