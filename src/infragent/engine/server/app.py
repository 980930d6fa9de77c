"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infragent.engine.sampling import RequestError
from infragent.engine.serving import QueueFull, RequestStream, ServingEngine
from infragent.engine.server.body_limit import BodyLimit
from infragent.engine.server.protocol import ChatCompletionRequest, CompletionRequest, error_body, new_id
from infragent.engine.server.responder import EngineUnavailable, Responder

log = logging.getLogger("infragent.server")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # a larger body is answered 413


class APIError(Exception):
    """An error to answer with OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers


def build_app(engine: ServingEngine, model_name: str, api_key: str | None = None,
              max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI app around a (not yet started) serving engine; the app's lifespan starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        yield
        engine.shutdown()

    app = FastAPI(title="infragent", lifespan=lifespan)
    metrics = engine.metrics
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, on_refused=lambda: metrics.refused("invalid"))
    responder = Responder(engine, model_name, metrics)
    max_prompt_chars = engine.max_model_len * engine.tokenizer.max_token_chars

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
        # the app re-raises after this answer, and the server then drops the connection: say so first
        return JSONResponse(error_body(f"internal error: {type(err).__name__}", "server_error"), 500,
                            headers={"Connection": "close"})

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

    def served(body: Any) -> None:
        if body.model is not None and body.model != model_name:
            raise APIError(404, f"model: {body.model!r} is not served here; this server serves {model_name!r} "
                                "(GET /v1/models lists it)", param="model", code="model_not_found",
                           kind="NotFoundError")

    def fits(chars: int, field: str) -> None:
        if chars > max_prompt_chars:  # cheap, before tokenizing: no token covers more characters than this
            raise APIError(400, f"{field}: {chars} characters cannot fit the context of {engine.max_model_len} "
                                f"tokens (one token covers at most {engine.tokenizer.max_token_chars}); "
                                "shorten it", param=field)

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        served(body)
        try:
            prompt = body.single_prompt()
        except ValueError as err:
            raise APIError(400, str(err), param="prompt") from None
        fits(len(prompt), "prompt")
        return await _generate(request, body, lambda: prompt, chat=False,
                               default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        served(body)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        except ValueError as err:
            raise APIError(400, str(err), param="messages") from None
        fits(sum(len(m["content"]) for m in messages), "messages")

        def render() -> str:
            try:
                return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            except ValueError as err:
                raise RequestError(f"messages: {err}") from None
        return await _generate(request, body, render, chat=True, default_max_tokens=None)

    async def _generate(request: Request, body: Any, prompt_of: Any, chat: bool,
                        default_max_tokens: int | None) -> Response:
        params = body.sampling_params(default_max_tokens)

        def submit() -> list[RequestStream]:  # templating and tokenizing off the event loop: streams go on
            return engine.submit_choices(prompt_of(), params, body.n)
        try:
            streams = await asyncio.to_thread(submit)
        except RequestError as err:
            raise APIError(400, str(err), param=str(err).split(":", 1)[0]) from None
        except QueueFull as err:
            raise APIError(429, str(err), code="queue_full", kind="rate_limit_error",
                           headers={"Retry-After": "1"}) from None
        rid = new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            return StreamingResponse(responder.sse(streams, rid, chat, body), media_type="text/event-stream")
        try:
            return await responder.whole(request, streams, rid, chat, body)
        except EngineUnavailable as err:
            raise APIError(503, str(err), kind="server_error", code="engine_unavailable") from None

    return app


def _describe_validation(err: RequestValidationError) -> tuple[str, str | None]:
    """One readable line naming the first bad field, and that field as OpenAI's `param`."""
    first = err.errors()[0] if err.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('msg', '')}; send a JSON object", None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc:  # a check over the whole body names its field at the start of its message
        return message, message.split(":", 1)[0].split(" ", 1)[0] if ":" in message else None
    field = ".".join(loc)
    return f"{field}: {message}", field
