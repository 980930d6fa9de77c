"""AsyncEngine: the LLMEngine loop in its own thread, fed by an inbox, streaming deltas to asyncio queues.

The event loop never runs model code. submit() validates and tokenizes on the caller's side (so bad input is
a 4xx at once), then hands the sequence to the engine thread; the thread steps the engine and posts each
step's deltas back to the loop in one call_soon_threadsafe. abort() is how a disconnect frees KV blocks and
the KDA state slot.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import AsyncIterator

from infragent.engine.config import EngineConfig
from infragent.engine.deltas import Delta, TextCursor
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams
from infragent.engine.sequence import Sequence
from infragent.engine.server.metrics import ServerMetrics

log = logging.getLogger("infragent.server")


class QueueFull(RuntimeError):
    """The bounded waiting queue is full; the caller should answer 429."""


class RequestStream:
    """The asyncio side of one request: deltas arrive on a queue filled by the engine thread."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.queue: asyncio.Queue[Delta] = asyncio.Queue()
        self.prompt_tokens = len(seq.prompt_token_ids)
        self.finished = False
        self.cursor = TextCursor(seq)
        self._last_token_time: float | None = None

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


class AsyncEngine:
    """Owns an LLMEngine and the thread that steps it."""

    def __init__(self, config: EngineConfig, max_waiting: int = 256, metrics: ServerMetrics | None = None) -> None:
        self.engine = LLMEngine(config)
        self.max_waiting = max_waiting
        self.metrics = metrics or ServerMetrics()
        self._inbox: queue.SimpleQueue[tuple[str, list[RequestStream]]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending_adds = 0  # submitted, not yet seen by the engine thread
        self._waiting = 0  # engine's waiting queue length after the last step
        self._streams: dict[int, RequestStream] = {}  # seq_id -> stream, engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._publish_gauges()

    @property
    def tokenizer(self):  # noqa: ANN201 - the engine's Tokenizer
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; deltas are delivered on loop."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (in-flight requests are aborted)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether the engine thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, prompt: str | list[int], params: SamplingParams, request_id: str = "") -> RequestStream:
        """Validate and queue a request (RequestError names a bad field; QueueFull means answer 429)."""
        return self.submit_choices(prompt, params, 1, request_id)[0]

    def submit_choices(self, prompt: str | list[int], params: SamplingParams, n: int,
                       request_id: str = "") -> list[RequestStream]:
        """submit() with n choices sampled from one prefill of the prompt (seeds seed, seed + 1, ...)."""
        with self._lock:
            if self._pending_adds + self._waiting >= self.max_waiting:
                raise QueueFull(f"{self._pending_adds + self._waiting} requests are waiting "
                                f"(max_waiting={self.max_waiting}); retry later")
            self._pending_adds += 1
        try:
            seq = self.engine.make_sequence(prompt, params, request_id)
            streams = [RequestStream(s) for s in [seq, *self.engine.fork(seq, n)]]
        except Exception:
            with self._lock:
                self._pending_adds -= 1
            raise
        self._inbox.put(("add", streams))
        self._wake.set()
        return streams

    def abort(self, stream: RequestStream) -> None:
        """Ask the engine thread to drop the request and free its blocks and slot."""
        if not stream.finished:
            self._inbox.put(("abort", [stream]))
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                update = self.engine.step_updates()
            except Exception as err:  # a bug must not take the server down: fail what was in flight
                log.exception("engine step failed")
                self._fail_all(f"engine error: {err}")
                continue
            self._publish(update.updated)
            self._publish_gauges()
        self._fail_all("server shutting down")

    def _drain_inbox(self) -> None:
        drained = False
        while True:
            try:
                kind, streams = self._inbox.get_nowait()
            except queue.Empty:
                break
            drained = True
            if kind == "add":
                with self._lock:
                    self._pending_adds -= 1
                self.engine.add_sequence(streams[0].seq)  # the first choice; the others are its forks
                self._streams.update((s.seq.seq_id, s) for s in streams)
                continue
            stream = streams[0]
            if stream.seq.seq_id in self._streams:
                self.engine.abort(stream.seq)
                del self._streams[stream.seq.seq_id]
                self.metrics.aborted(stream.prompt_tokens, len(stream.seq.output_token_ids))
        if drained:
            self._publish_gauges()

    def _publish(self, updated: list[Sequence]) -> None:
        now = time.perf_counter()
        posts = []
        for seq in updated:
            stream = self._streams.get(seq.seq_id)
            if stream is None:
                continue
            if stream._last_token_time is None:
                self.metrics.ttft.observe(now - seq.arrival_time)
                self.metrics.prefilled(len(seq.prompt_token_ids), seq.num_cached_tokens)
            else:
                self.metrics.itl.observe(now - stream._last_token_time)
            stream._last_token_time = now
            finished = seq.finish_reason is not None
            delta = stream.cursor.next_delta(finished)
            if finished:
                del self._streams[seq.seq_id]
            if delta.text or delta.logprobs or finished:
                posts.append((stream.queue, delta))
        if posts:
            self._post(posts)

    def _fail_all(self, message: str) -> None:
        posts = []
        for stream in list(self._streams.values()):
            self.engine.abort(stream.seq)
            posts.append((stream.queue, Delta("", len(stream.seq.output_token_ids), None, error=message)))
        self._streams.clear()
        if posts:
            self._post(posts)

    def _post(self, posts: list[tuple[asyncio.Queue, Delta]]) -> None:
        if self._loop is None or self._loop.is_closed():
            return

        def deliver() -> None:
            for q, delta in posts:
                q.put_nowait(delta)
        try:
            self._loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _publish_gauges(self) -> None:
        engine = self.engine
        waiting = len(engine.scheduler.waiting)
        with self._lock:
            self._waiting = waiting
            pending = self._pending_adds
        slots = engine.slots
        self.metrics.set_state(
            running=len(engine.scheduler.running), waiting=waiting + pending,
            kv_blocks_used=engine.blocks.num_blocks - engine.blocks.num_free_blocks,
            kv_blocks_total=engine.blocks.num_blocks,
            state_slots_used=(slots.num_slots - len(slots.free)) if slots else 0,
            state_slots_total=slots.num_slots if slots else 0, prompt_tokens_computed=engine.prompt_tokens_computed)
