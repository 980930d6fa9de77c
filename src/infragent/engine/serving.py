"""What the HTTP server drives: a ServingEngine (AsyncEngine in one process, DisaggEngine over worker
processes), the RequestStream each request's deltas arrive on, and the admission limit (429) both share."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import AsyncIterator, Iterator, Protocol

from infragent.engine.deltas import Delta, TextCursor
from infragent.engine.metrics import ServerMetrics
from infragent.engine.sampling import SamplingParams
from infragent.engine.sequence import Sequence
from infragent.engine.tokenizer import Tokenizer


class QueueFull(RuntimeError):
    """The bounded waiting queue is full; the caller should answer 429."""


class Admission:
    """The bounded waiting queue: requests submitted and not yet taken up (pending) plus those the engine
    holds waiting (queued, as last published) may not exceed max_waiting."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.pending = 0
        self.queued = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def submitting(self) -> Iterator[None]:
        """Hold a pending place while the request is validated (QueueFull past the limit); a request that
        fails validation gives its place back."""
        with self._lock:
            waiting = self.pending + self.queued
            if waiting >= self.max_waiting:
                raise QueueFull(f"{waiting} requests are waiting (max_waiting={self.max_waiting}); retry later")
            self.pending += 1
        try:
            yield
        except BaseException:
            self.taken()
            raise

    def taken(self) -> None:
        """A pending request was taken up by the engine (or refused)."""
        with self._lock:
            self.pending -= 1

    def publish(self, queued: int) -> int:
        """Record how many the engine holds waiting; returns the pending count beside it."""
        with self._lock:
            self.queued = queued
            return self.pending


class RequestStream:
    """The asyncio side of one request: deltas arrive on a queue filled by the engine's thread."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.queue: asyncio.Queue[Delta] = asyncio.Queue()
        self.prompt_tokens = len(seq.prompt_token_ids)
        self.finished = False
        self.cursor = TextCursor(seq)
        self.last_token_time: float | None = None

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas until the finishing one (inclusive)."""
        while True:
            delta = await self.queue.get()
            yield delta
            if delta.finish_reason is not None or delta.error is not None:
                self.finished = True
                return

    async def collect(self) -> Delta:
        """All output as one Delta (text joined, last finish_reason)."""
        parts, logprobs = [], []
        async for delta in self.deltas():
            parts.append(delta.text)
            logprobs += delta.logprobs or []
            if delta.finish_reason is not None or delta.error is not None:
                return Delta("".join(parts), delta.completion_tokens, delta.finish_reason, delta.error,
                             logprobs if self.seq.params.logprobs is not None else None)
        raise RuntimeError("stream ended without a finishing delta")


class ServingEngine(Protocol):
    """The interface the HTTP app serves through (AsyncEngine and DisaggEngine subclass it)."""

    metrics: ServerMetrics
    admission: Admission
    tokenizer: Tokenizer  # chat templates, the prompt-size bound
    max_model_len: int  # the context requests are checked against

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start serving; deltas are delivered on loop."""

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop serving (requests in flight fail)."""

    def is_alive(self) -> bool:
        """Whether requests can be served now."""

    def submit_choices(self, prompt: str | list[int], params: SamplingParams, n: int,
                       request_id: str = "") -> list[RequestStream]:
        """Validate and queue a request with n choices (RequestError names a bad field; QueueFull: 429)."""

    def abort(self, stream: RequestStream) -> None:
        """Drop the request wherever it is and free what it holds."""

    def submit(self, prompt: str | list[int], params: SamplingParams, request_id: str = "") -> RequestStream:
        """submit_choices with one choice."""
        return self.submit_choices(prompt, params, 1, request_id)[0]
