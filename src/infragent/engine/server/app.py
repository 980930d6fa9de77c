"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infragent.engine.disagg.router import DisaggEngine
from infragent.engine.sampling import RequestError
from infragent.engine.server.async_engine import AsyncEngine, QueueFull, RequestStream
from infragent.engine.server.protocol import (ChatCompletionRequest, CompletionRequest, chunk_body,
                                              completion_body, error_body, new_id, usage)

log = logging.getLogger("infragent.server")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class APIError(Exception):
    """An error to answer with OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers


def build_app(engine: AsyncEngine | DisaggEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app around a (not yet started) AsyncEngine; the app's lifespan starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        yield
        engine.shutdown()

    app = FastAPI(title="infragent", lifespan=lifespan)
    metrics = engine.metrics

    async def authorize(request: Request) -> None:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        metrics.refused("rejected" if err.status == 429 else "invalid" if err.status < 500 else "error")
        return JSONResponse(error_body(err.message, err.kind, err.param, err.code), err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        metrics.refused("invalid")
        message, param = _describe_validation(err)
        return JSONResponse(error_body(message, param=param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        metrics.refused("invalid" if err.status_code < 500 else "error")
        return JSONResponse(error_body(str(err.detail), "invalid_request_error" if err.status_code < 500
                                       else "server_error"), err.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        metrics.refused("error")
        return JSONResponse(error_body(f"internal error: {type(err).__name__}", "server_error"), 500)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_alive() else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "infragent", "max_model_len": engine.max_model_len}]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        try:
            prompt = body.single_prompt()
        except ValueError as err:
            raise APIError(400, str(err), param="prompt") from None
        return await _generate(request, body, prompt, chat=False, default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as err:
            raise APIError(400, str(err), param="messages") from None
        return await _generate(request, body, prompt, chat=True, default_max_tokens=engine.max_model_len)

    async def _generate(request: Request, body: Any, prompt: str | list[int], chat: bool,
                        default_max_tokens: int) -> Response:
        params = body.sampling_params(default_max_tokens)
        try:
            stream = engine.submit(prompt, params)
        except RequestError as err:
            raise APIError(400, str(err), param=str(err).split(":", 1)[0]) from None
        except QueueFull as err:
            raise APIError(429, str(err), code="queue_full", kind="rate_limit_error",
                           headers={"Retry-After": "1"}) from None
        rid = new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            return StreamingResponse(_sse(stream, rid, chat, body.include_usage), media_type="text/event-stream")
        return await _whole(request, stream, rid, chat)

    async def _whole(request: Request, stream: RequestStream, rid: str, chat: bool) -> Response:
        result = asyncio.ensure_future(stream.collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not result.done():  # client left (or the server is shutting down): stop the work
                engine.abort(stream)
                result.cancel()
            gone.cancel()
        if not result.done() or result.cancelled():
            return Response(status_code=499)
        out = result.result()
        if out.error is not None:
            raise APIError(503, out.error, kind="server_error", code="engine_unavailable")
        used = usage(stream.prompt_tokens, out.completion_tokens)
        metrics.delivered(out.finish_reason or "stop", stream.prompt_tokens, out.completion_tokens)
        return JSONResponse(completion_body(rid, model_name, out.text, out.finish_reason, used, chat))

    async def _sse(stream: RequestStream, rid: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        try:
            first = True
            async for delta in stream.deltas():
                if delta.error is not None:
                    yield _event(error_body(delta.error, "server_error"))
                    break
                if delta.text or first:
                    yield _event(chunk_body(rid, model_name, delta.text, None, chat, first=first))
                    first = False
                if delta.finish_reason is not None:
                    yield _event(chunk_body(rid, model_name, None if chat else "", delta.finish_reason, chat))
                    if include_usage:
                        yield _event(chunk_body(rid, model_name, None, None, chat,
                                                used=usage(stream.prompt_tokens, delta.completion_tokens)))
                    metrics.delivered(delta.finish_reason, stream.prompt_tokens, delta.completion_tokens)
            yield "data: [DONE]\n\n"
        finally:
            engine.abort(stream)  # no-op when finished; a disconnect cancels us mid-stream

    return app


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _describe_validation(err: RequestValidationError) -> tuple[str, str | None]:
    """One readable line naming the first bad field, and that field as OpenAI's `param`."""
    first = err.errors()[0] if err.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('msg', '')}; send a JSON object", None
    field = ".".join(loc) or "body"
    return f"{field}: {first.get('msg', 'invalid value')}", field
