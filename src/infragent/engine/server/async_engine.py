"""AsyncEngine: the LLMEngine loop in its own thread, fed by an inbox, streaming deltas to asyncio queues.

The event loop never runs model code. submit() validates and tokenizes on the caller's side (so bad input is
a 4xx at once), then hands the sequence to the engine thread; the thread steps the engine and posts each
step's deltas back to the loop in one call_soon_threadsafe. abort() is how a disconnect frees KV blocks and
the KDA state slot. A parallel engine that lost a rank cannot run another step: the engine is then broken,
its requests fail with the cause, /health answers 503 and new requests are refused with the cause (503), while
the server itself stays up.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time

from infragent.engine.config import EngineConfig
from infragent.engine.deltas import Delta
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.parallel.group import RankDiedError
from infragent.engine.sampling import SamplingParams
from infragent.engine.sequence import Sequence
from infragent.engine.serving import Admission, RequestStream, ServingEngine
from infragent.engine.metrics import ServerMetrics
from infragent.engine.server.step_profiler import StepProfiler
from infragent.engine.server.responder import EngineUnavailable

log = logging.getLogger("infragent.server")


class AsyncEngine(ServingEngine):
    """Owns an LLMEngine and the thread that steps it (a ServingEngine)."""

    def __init__(self, config: EngineConfig, max_waiting: int = 256, metrics: ServerMetrics | None = None,
                 profile_dir: str | None = None) -> None:
        self.engine = LLMEngine(config)
        self.profiler = StepProfiler(profile_dir) if profile_dir else None  # /start_profile, /stop_profile
        self.admission = Admission(max_waiting)
        self.metrics = metrics or ServerMetrics()
        self._inbox: queue.SimpleQueue[tuple[str, list[RequestStream]]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._streams: dict[int, RequestStream] = {}  # seq_id -> stream, engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.broken: str | None = None  # why no step can run any more (a parallel rank died), once so
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
        """Whether the engine thread is running and can still run steps."""
        return self._thread is not None and self._thread.is_alive() and self.broken is None

    def submit_choices(self, prompt: str | list[int], params: SamplingParams, n: int,
                       request_id: str = "") -> list[RequestStream]:
        """submit() with n choices sampled from one prefill of the prompt (seeds seed, seed + 1, ...)."""
        if self.broken is not None:
            raise EngineUnavailable(self.broken)
        with self.admission.submitting():
            seq = self.engine.make_sequence(prompt, params, request_id)
            streams = [RequestStream(s) for s in [seq, *self.engine.fork(seq, n)]]
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
            if self.profiler is not None:
                self.profiler.poll()
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                with self.profiler.marked() if self.profiler is not None else contextlib.nullcontext():
                    update = self.engine.step_updates()
            except RankDiedError as err:  # no step can run again: refuse from now on, keep the server up
                log.error("engine broken: %s", err)
                self.broken = f"engine error: {err}"
                self._fail_all(self.broken)
                continue
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
                self.admission.taken()
                if self.broken is not None:  # submitted just before the engine broke
                    self._post([(s.queue, Delta("", 0, None, error=self.broken)) for s in streams])
                    continue
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
            if stream.last_token_time is None:
                self.metrics.ttft.observe(now - seq.arrival_time)
                self.metrics.prefilled(len(seq.prompt_token_ids), seq.num_cached_tokens)
            else:
                self.metrics.itl.observe(now - stream.last_token_time)
            stream.last_token_time = now
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
        pending = self.admission.publish(waiting)
        slots = engine.slots
        self.metrics.set_state(
            running=len(engine.scheduler.running), waiting=waiting + pending,
            kv_blocks_used=engine.blocks.num_blocks - engine.blocks.num_free_blocks,
            kv_blocks_total=engine.blocks.num_blocks,
            state_slots_used=(slots.num_slots - len(slots.free)) if slots else 0,
            state_slots_total=slots.num_slots if slots else 0, prompt_tokens_computed=engine.prompt_tokens_computed,
            preemptions=engine.scheduler.num_preemptions)
        if engine.shape.num_experts:
            self.metrics.set_expert_load(engine.model.expert_load())
