"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, and
/start_profile, /stop_profile (vLLM's and SGLang's convention)."""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
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
from infragent.engine.server.step_profiler import ProfileError, StepProfiler

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


@dataclass
class Served:
    """What the routes serve, kept on app.state: the routes are module functions that reach it through the
    request, so that nothing outside the app (FastAPI caches what it learns about each endpoint function,
    process-wide) holds the engine once the app is gone."""

    engine: ServingEngine
    model_name: str
    api_key: str | None
    responder: Responder
    max_prompt_chars: int


def build_app(engine: ServingEngine, model_name: str, api_key: str | None = None,
              max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI app around a (not yet started) serving engine; the app's lifespan starts and stops it."""
    app = FastAPI(title="infragent", lifespan=_lifespan)
    metrics = engine.metrics
    app.state.served = Served(engine, model_name, api_key, Responder(engine, model_name, metrics),
                              engine.max_model_len * engine.tokenizer.max_token_chars)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, on_refused=lambda: metrics.refused("invalid"))
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _prometheus, methods=["GET"])
    guarded = [Depends(_authorize)]
    app.add_api_route("/v1/models", _models, methods=["GET"], dependencies=guarded)
    app.add_api_route("/v1/completions", _completions, methods=["POST"], dependencies=guarded)
    app.add_api_route("/v1/chat/completions", _chat_completions, methods=["POST"], dependencies=guarded)
    app.add_api_route("/start_profile", _start_profile, methods=["POST"], dependencies=guarded)
    app.add_api_route("/stop_profile", _stop_profile, methods=["POST"], dependencies=guarded)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = app.state.served.engine
    engine.start(asyncio.get_running_loop())
    yield
    engine.shutdown()


def _served(request: Request) -> Served:
    return request.app.state.served


async def _authorize(request: Request) -> None:
    api_key = _served(request).api_key
    if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


async def _api_error(request: Request, err: APIError) -> JSONResponse:
    _served(request).engine.metrics.refused(
        "rejected" if err.status == 429 else "invalid" if err.status < 500 else "error")
    return JSONResponse(error_body(err.message, err.kind, err.param, err.code), err.status, headers=err.headers)


async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    _served(request).engine.metrics.refused("invalid")
    message, param = _describe_validation(err)
    return JSONResponse(error_body(message, param=param), 400)


async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    _served(request).engine.metrics.refused("invalid" if err.status_code < 500 else "error")
    return JSONResponse(error_body(str(err.detail), "invalid_request_error" if err.status_code < 500
                                   else "server_error"), err.status_code)


async def _unexpected(request: Request, err: Exception) -> JSONResponse:
    log.exception("unhandled error")
    _served(request).engine.metrics.refused("error")
    # the app re-raises after this answer, and the server then drops the connection: say so first
    return JSONResponse(error_body(f"internal error: {type(err).__name__}", "server_error"), 500,
                        headers={"Connection": "close"})


async def _health(request: Request) -> Response:
    return Response(status_code=200 if _served(request).engine.is_alive() else 503)


async def _prometheus(request: Request) -> Response:
    return Response(_served(request).engine.metrics.render(), media_type="text/plain; version=0.0.4")


def _profiler(request: Request) -> StepProfiler:
    profiler = getattr(_served(request).engine, "profiler", None)
    if profiler is None:
        raise APIError(400, "profiling is off: start the server with --profile-dir DIR (not available with --disagg)",
                       code="profiling_off")
    return profiler


async def _start_profile(request: Request) -> dict[str, Any]:
    profiler = _profiler(request)
    try:
        await asyncio.to_thread(profiler.start)
    except ProfileError as err:
        raise APIError(409, str(err), code="profile_state") from None
    return {"status": "profiling", "directory": str(profiler.directory)}


async def _stop_profile(request: Request) -> dict[str, Any]:
    profiler = _profiler(request)
    try:
        written = await asyncio.to_thread(profiler.stop)
    except ProfileError as err:
        raise APIError(409, str(err), code="profile_state") from None
    return {"status": "stopped", "traces": [written] if written else []}


async def _models(request: Request) -> dict[str, Any]:
    served = _served(request)
    return {"object": "list", "data": [{"id": served.model_name, "object": "model", "created": int(time.time()),
                                        "owned_by": "infragent", "max_model_len": served.engine.max_model_len}]}


def _check_model(served: Served, body: Any) -> None:
    if body.model is not None and body.model != served.model_name:
        raise APIError(404, f"model: {body.model!r} is not served here; this server serves {served.model_name!r} "
                            "(GET /v1/models lists it)", param="model", code="model_not_found", kind="NotFoundError")


def _check_fits(served: Served, chars: int, field: str) -> None:
    if chars > served.max_prompt_chars:  # cheap, before tokenizing: no token covers more characters than this
        engine = served.engine
        raise APIError(400, f"{field}: {chars} characters cannot fit the context of {engine.max_model_len} "
                            f"tokens (one token covers at most {engine.tokenizer.max_token_chars}); shorten it",
                       param=field)


async def _completions(body: CompletionRequest, request: Request) -> Response:
    served = _served(request)
    _check_model(served, body)
    try:
        prompt = body.single_prompt()
    except ValueError as err:
        raise APIError(400, str(err), param="prompt") from None
    _check_fits(served, len(prompt), "prompt")
    return await _generate(served, request, body, lambda: prompt, chat=False,
                           default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)


async def _chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    served = _served(request)
    _check_model(served, body)
    try:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    except ValueError as err:
        raise APIError(400, str(err), param="messages") from None
    _check_fits(served, sum(len(m["content"]) for m in messages), "messages")

    def render() -> str:
        try:
            return served.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as err:
            raise RequestError(f"messages: {err}") from None
    return await _generate(served, request, body, render, chat=True, default_max_tokens=None)


async def _generate(served: Served, request: Request, body: Any, prompt_of: Any, chat: bool,
                    default_max_tokens: int | None) -> Response:
    params = body.sampling_params(default_max_tokens)

    def submit() -> list[RequestStream]:  # templating and tokenizing off the event loop: streams go on
        return served.engine.submit_choices(prompt_of(), params, body.n)
    try:
        streams = await asyncio.to_thread(submit)
    except RequestError as err:
        raise APIError(400, str(err), param=str(err).split(":", 1)[0]) from None
    except QueueFull as err:
        raise APIError(429, str(err), code="queue_full", kind="rate_limit_error",
                       headers={"Retry-After": "1"}) from None
    except EngineUnavailable as err:  # the engine cannot run steps any more (a parallel rank died)
        raise APIError(503, str(err), kind="server_error", code="engine_unavailable") from None
    rid = new_id("chatcmpl" if chat else "cmpl")
    if body.stream:
        return StreamingResponse(served.responder.sse(streams, rid, chat, body), media_type="text/event-stream")
    try:
        return await served.responder.whole(request, streams, rid, chat, body)
    except EngineUnavailable as err:
        raise APIError(503, str(err), kind="server_error", code="engine_unavailable") from None


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
