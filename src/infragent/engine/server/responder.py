"""Responder: one request's engine streams (one per choice) as OpenAI's whole response or its server-sent
events — text, finish reasons, logprobs in the chat or the completions (legacy) format, echo, usage."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from infragent.engine.deltas import Delta
from infragent.engine.metrics import ServerMetrics
from infragent.engine.outputs import prompt_top_logprobs
from infragent.engine.sampling import TokenLogprob
from infragent.engine.serving import RequestStream, ServingEngine
from infragent.engine.server.logprob_bodies import chat_logprobs, completion_logprobs
from infragent.engine.server.protocol import choice_body, chunk_body, completion_body, error_body, usage


class EngineUnavailable(Exception):
    """The engine failed the request (it stopped, or a worker died): answer 503 with this message."""


@dataclass
class _Progress:
    """What one choice has streamed so far."""

    first: bool = True
    offset: int = 0  # characters sent: completions' text offsets
    tokens: int = 0
    finish_reason: str | None = None
    chunks: list[str] = field(default_factory=list)


class Responder:
    """Builds the responses of one server: knows its model name, tokenizer and metrics."""

    def __init__(self, engine: ServingEngine, model_name: str, metrics: ServerMetrics) -> None:
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.token_bytes = engine.tokenizer.token_bytes

    def _logprobs(self, body: Any, chat: bool, items: list[TokenLogprob], offset: int) -> dict[str, Any] | None:
        """A choice's logprobs object for these generated tokens (None when not asked for)."""
        if body.token_logprobs() is None:
            return None
        if chat:
            return chat_logprobs(items, self.token_bytes)
        return completion_logprobs(items, [i.token for i in items], self.token_bytes, offset)

    def _echo(self, body: Any, stream: RequestStream) -> tuple[str, dict[str, Any] | None]:
        """Completions' echo: the prompt's text and, with logprobs, its tokens' log-probabilities."""
        seq = stream.seq
        text = seq.prompt if seq.prompt is not None else self.engine.tokenizer.decode(seq.prompt_token_ids)
        if body.logprobs is None:
            return text, None
        items: list[TokenLogprob | None] = [None, *(prompt_top_logprobs(seq) or [])]
        return text, completion_logprobs(items, seq.prompt_token_ids, self.token_bytes)

    def _abort(self, streams: list[RequestStream]) -> None:
        for stream in streams:
            self.engine.abort(stream)  # no-op once finished

    async def whole(self, request: Request, streams: list[RequestStream], rid: str, chat: bool,
                    body: Any) -> Response:
        """Wait for every choice (or the client leaving: 499) and answer with one body."""
        results = asyncio.ensure_future(asyncio.gather(*(s.collect() for s in streams)))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not results.done():  # client left (or the server is shutting down): stop the work
                self._abort(streams)
                results.cancel()
            gone.cancel()
        if not results.done() or results.cancelled():
            return Response(status_code=499)
        outs: list[Delta] = results.result()
        failed = next((out.error for out in outs if out.error is not None), None)
        if failed is not None:
            raise EngineUnavailable(failed)
        scores_only = not chat and body.scores_only
        choices, tokens = [], 0
        for index, (stream, out) in enumerate(zip(streams, outs)):
            text = "" if scores_only else out.text
            tokens += 0 if scores_only else out.completion_tokens
            logprobs = None if scores_only else self._logprobs(body, chat, out.logprobs or [], 0)
            if not chat and body.echo:
                echoed, echo_logprobs = self._echo(body, stream)
                text = echoed + text
                if echo_logprobs is not None:
                    logprobs = _joined(echo_logprobs, logprobs, len(echoed))
            choices.append(choice_body(index, text, out.finish_reason, chat, logprobs))
        prompt_tokens = streams[0].prompt_tokens
        self.metrics.delivered(outs[0].finish_reason or "stop", prompt_tokens, tokens)
        return JSONResponse(completion_body(rid, self.model_name, choices, usage(prompt_tokens, tokens), chat))

    async def sse(self, streams: list[RequestStream], rid: str, chat: bool, body: Any) -> AsyncIterator[str]:
        """The choices' deltas as they come, each chunk naming its choice; usage and [DONE] at the end."""
        progress = [_Progress() for _ in streams]
        scores_only = not chat and body.scores_only
        try:
            if not chat and body.echo:
                for index, stream in enumerate(streams):
                    echoed, echo_logprobs = self._echo(body, stream)
                    yield _event(chunk_body(rid, self.model_name, echoed, None, chat, logprobs=echo_logprobs,
                                            index=index))
                    progress[index].first, progress[index].offset = False, len(echoed)
            async for index, delta in _merged(streams):
                if delta.error is not None:
                    yield _event(error_body(delta.error, "server_error"))
                    break
                for event in self._chunks(progress[index], index, delta, rid, chat, body, scores_only):
                    yield event
            else:
                tokens = sum(p.tokens for p in progress)
                if body.include_usage:
                    yield _event(chunk_body(rid, self.model_name, None, None, chat,
                                            used=usage(streams[0].prompt_tokens, tokens)))
                self.metrics.delivered(progress[0].finish_reason or "stop", streams[0].prompt_tokens, tokens)
            yield "data: [DONE]\n\n"
        finally:
            self._abort(streams)  # a disconnect cancels us mid-stream

    def _chunks(self, state: _Progress, index: int, delta: Delta, rid: str, chat: bool, body: Any,
                scores_only: bool) -> list[str]:
        """The events one delta of one choice makes: its text (with the finish reason when it is the last
        token's, as vLLM sends it), else a finishing chunk of its own."""
        events = []
        logprobs = None if scores_only else self._logprobs(body, chat, delta.logprobs or [], state.offset)
        text = "" if scores_only else delta.text
        finished = False
        if text or state.first or (logprobs and delta.logprobs):
            finished = bool(text) and delta.finish_reason is not None
            events.append(_event(chunk_body(rid, self.model_name, text, delta.finish_reason if finished else None,
                                            chat, first=state.first, logprobs=logprobs, index=index)))
            state.first, state.offset = False, state.offset + len(text)
        if delta.finish_reason is not None:
            state.finish_reason = delta.finish_reason
            state.tokens = 0 if scores_only else delta.completion_tokens
            if not finished:
                events.append(_event(chunk_body(rid, self.model_name, None if chat else "", delta.finish_reason,
                                                chat, index=index)))
        return events


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from every stream as they arrive, until each has finished."""
    if len(streams) == 1:
        async for delta in streams[0].deltas():
            yield 0, delta
        return
    inbox: asyncio.Queue[tuple[int, Delta | None]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        async for delta in stream.deltas():
            await inbox.put((index, delta))
        await inbox.put((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    live = len(streams)
    try:
        while live:
            index, delta = await inbox.get()
            if delta is None:
                live -= 1
                continue
            yield index, delta
    finally:
        for task in tasks:
            task.cancel()


def _joined(echo: dict[str, Any], generated: dict[str, Any] | None, offset: int) -> dict[str, Any]:
    """Completions' logprobs of the echoed prompt followed by the generated tokens' (offsets shifted)."""
    if generated is None:
        return echo
    return {key: echo[key] + generated[key] for key in echo} | {
        "text_offset": echo["text_offset"] + [offset + o for o in generated["text_offset"]]}


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
