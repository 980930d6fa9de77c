"""An OpenAI-compatible front with llama-cpp-python's server conventions, over our real server: `prompt` must be
a string (a token-id list gets HTTP 500 with the validation errors in its message, as llama-cpp-python 0.3.36's
server answers it; ids_status=422 answers as FastAPI's own validation does), and the stream carries no `usage`
(stream_options is ignored). Generation is the real engine's behind it.

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


def front_app(upstream: str, refuse: int | None = None, ids_status: int = 500) -> FastAPI:
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
            error = {"type": "string_type", "loc": ["body", "prompt", "str"], "msg": "Input should be a valid string",
                     "input": body.get("prompt")}
            if ids_status == 422:
                return JSONResponse({"detail": [error]}, status_code=422)
            return JSONResponse({"error": {"message": f"1 validation error:\n  {error}"}}, status_code=ids_status)
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
def text_only_front(upstream: str, refuse: int | None = None, ids_status: int = 500) -> Iterator[str]:
    """Serve the front on a free port in a thread; yield its base URL."""
    port = free_port()
    app = front_app(upstream, refuse, ids_status)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    with in_thread(server, port) as url:
        yield url
