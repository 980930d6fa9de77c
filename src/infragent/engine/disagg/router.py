"""DisaggEngine: the router of `infragent serve --disagg`, a ServingEngine (engine/serving.py) like AsyncEngine.

The router tokenizes and validates, gives each request store blocks (and a KDA state slot), sends it to the
least-loaded live prefill worker, hands it to the least-loaded live decode worker once its KV is in the
store, and relays the decode worker's text deltas to the request's asyncio queue. All of its state lives on
one thread ("router"); a reader thread per worker turns pipe messages, and the worker's death, into inbox
items. A dead worker fails its requests at once with an error that names it; a request stuck in prefill, in
waiting for admission, or between two tokens for longer than transfer_timeout_s fails too. Nothing waits
forever.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.deltas import Delta
from infragent.engine.disagg.messages import (Abort, Admitted, AttachStore, Broken, Decode, Deltas, Dropped, Failed,
                                               Prefill, Prefilled, Released, TextDelta, ToRouter, ToWorker)
from infragent.engine.disagg.processes import (WorkerHandle, open_store, read_messages, spawn_workers, stop_workers,
                                               wait_ready)
from infragent.engine.disagg.store import StoreIndex
from infragent.engine.gguf_weights import read_gguf
from infragent.engine.requests import make_sequence
from infragent.engine.sampling import RequestError, SamplingParams
from infragent.engine.metrics import ServerMetrics
from infragent.engine.serving import Admission, RequestStream, ServingEngine
from infragent.engine.tokenizer import Tokenizer

log = logging.getLogger("infragent.disagg")
KV_STORES = ("shm", "tcp")


@dataclass
class DisaggConfig:
    """How the serving is split: worker counts, the store's transport, the transfer timeout."""

    prefill_workers: int = 1
    decode_workers: int = 1
    kv_store: str = "shm"  # shared memory; "tcp" serves the store over a socket (also the fallback)
    transfer_timeout_s: float = 60.0  # per request: prefill + KV landing, the wait for admission, each token gap
    start_timeout_s: float = 600.0  # a worker must load its model and report ready within this

    def check(self, config: EngineConfig) -> None:
        """ConfigError naming the field when the split cannot run."""
        for name in ("prefill_workers", "decode_workers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.kv_store not in KV_STORES:
            raise ConfigError(f"kv_store: {self.kv_store!r}; choose one of {', '.join(KV_STORES)}")
        if not self.transfer_timeout_s > 0:
            raise ConfigError(f"transfer_timeout_s: must be positive, got {self.transfer_timeout_s}")
        clash = [name for name, on in (("tensor_parallel_size", config.tensor_parallel_size > 1),
                                       ("pipeline_parallel_size", config.pipeline_parallel_size > 1),
                                       ("speculative", config.speculative is not None),
                                       ("kv_layout contiguous", config.kv_layout != "paged")) if on]
        if clash:
            raise ConfigError(f"disagg: does not combine with {', '.join(clash)} yet; turn them off")


@dataclass
class Flight:
    """One request between submit and its last delta."""

    stream: RequestStream
    stage: str = "queued"  # queued → prefill → decode
    worker: WorkerHandle | None = None
    deadline: float = float("inf")  # for prefill + transfer, admission, then each next token
    admitted: bool = False
    completion_tokens: int = 0
    last_token_time: float | None = None
    rid: str = field(default="")


class DisaggEngine(ServingEngine):
    """Router + prefill workers + decode workers + KV store."""

    def __init__(self, config: EngineConfig, disagg: DisaggConfig | None = None, max_waiting: int = 256,
                 metrics: ServerMetrics | None = None) -> None:
        self.disagg = disagg = disagg or DisaggConfig()
        disagg.check(config)
        self.admission = Admission(max_waiting)  # pending: submitted, not yet sent to a prefill worker
        self.metrics = metrics or ServerMetrics()
        self.tokenizer = Tokenizer.from_reader(read_gguf(config.gguf_path))
        self.workers = spawn_workers(config, disagg.prefill_workers, disagg.decode_workers, disagg.transfer_timeout_s)
        try:
            infos = [wait_ready(w, disagg.start_timeout_s) for w in self.workers]
            layout = infos[-1].layout  # a decode worker's: the store holds what one decode cache holds
            self.store = open_store(layout, disagg.kv_store)
        except BaseException:
            stop_workers(self.workers)
            raise
        for w in self.workers:
            w.send(AttachStore(self.store.address))
            log.info("%s ready", w.name)
        log.info("KV store: %s, %d blocks of %d tokens, %d state slots", self.store.address[0], layout.num_blocks,
                 layout.block_size, layout.num_state_slots)
        self.index = StoreIndex(layout)
        self.vocab_size, self.max_model_len = infos[0].vocab_size, infos[0].max_model_len
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._flights: dict[str, Flight] = {}
        self._queued: collections.deque[Flight] = collections.deque()
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []

    # the ServingEngine interface the app uses

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the router thread and one reader per worker; deltas are delivered on loop."""
        self._loop = loop
        self._publish_gauges()  # /metrics shows the workers from the first request on, not after the first route
        self._threads = [threading.Thread(target=read_messages, args=(w, self._inbox, self._stop),
                                          name=f"read-{w.role}-{w.index}", daemon=True) for w in self.workers]
        self._threads.append(threading.Thread(target=self._route, name="router", daemon=True))
        for thread in self._threads:
            thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop routing (requests in flight fail), stop the workers, remove the store."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        stop_workers(self.workers, timeout)
        self.store.close()

    def is_alive(self) -> bool:
        """Whether requests can be served: the router runs and both roles have a live worker."""
        router = bool(self._threads) and self._threads[-1].is_alive()
        return router and all(any(w.alive for w in self.workers if w.role == role) for role in ("prefill", "decode"))

    def submit_choices(self, prompt: str | list[int], params: SamplingParams, n: int,
                       request_id: str = "") -> list[RequestStream]:
        """Validate and queue a request (RequestError names a bad field; QueueFull means answer 429)."""
        with self.admission.submitting():
            if params.logprobs is not None or params.prompt_top_logprobs is not None:
                raise RequestError("logprobs: not served by the disaggregated router yet (the first token is "
                                   "sampled in a prefill worker); leave it out or serve without --disagg")
            if n != 1:
                raise RequestError("n: more than one choice is not served by the disaggregated router yet; "
                                   "send n=1 or serve without --disagg")
            seq = make_sequence(self.tokenizer, self.vocab_size, self.max_model_len, prompt, params,
                                request_id or f"disagg-{next(self._ids)}")
        stream = RequestStream(seq)
        self._inbox.put(("add", stream))
        return [stream]

    def abort(self, stream: RequestStream) -> None:
        """Drop the request wherever it is (its store blocks are freed once its worker lets go)."""
        if not stream.finished:
            self._inbox.put(("abort", stream))

    # the router thread

    def _route(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):  # handle everything waiting, then route
                item = self._inbox.get(timeout=0.05)
                while True:
                    self._handle(item)
                    item = self._inbox.get_nowait()
            self._dispatch()
            self._expire(time.monotonic())
            self._publish_gauges()
        for flight in list(self._flights.values()):
            self._fail(flight, "server shutting down", "shutdown")

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "add":
            flight = Flight(item[1], rid=item[1].seq.request_id)
            self._flights[flight.rid] = flight
            self._queued.append(flight)
        elif kind == "abort":
            flight = self._flights.pop(item[1].seq.request_id, None)
            if flight is not None:
                self.metrics.aborted(flight.stream.prompt_tokens, flight.completion_tokens)
                self._leave(flight)
        elif kind == "died":
            self._died(item[1])
        else:
            self._on_message(item[1], item[2])

    def _on_message(self, worker: WorkerHandle, message: ToRouter) -> None:
        if isinstance(message, Prefilled):
            self._prefilled(message)
        elif isinstance(message, (Admitted, Dropped)):
            self.index.free(message.rid)
            flight = self._flights.get(message.rid)
            if flight is not None and isinstance(message, Admitted):
                flight.admitted = True
                flight.deadline = time.monotonic() + self.disagg.transfer_timeout_s
        elif isinstance(message, Deltas):
            self._deltas(message.deltas)
        elif isinstance(message, Failed):
            if message.released:
                self.index.free(message.rid)
            flight = self._flights.get(message.rid)
            if flight is not None:  # named by the router, which knows which worker it was
                said = message.message.removeprefix(f"{worker.role} worker: ")
                self._fail(flight, f"{worker.name}: {said}", "worker_error")
        elif isinstance(message, Released):
            for fenced in message.rids:
                self.index.free(fenced)
        elif isinstance(message, Broken):  # it is leaving: its exit fails what it held, naming this cause
            worker.cause = message.message

    def _dispatch(self) -> None:
        """Queued requests to prefill workers while the store has room (FCFS)."""
        while self._queued:
            flight = self._queued[0]
            if flight.rid not in self._flights:  # aborted while queued
                self._queued.popleft()
                self._started()
                continue
            worker = self._least_loaded("prefill")
            if worker is None:
                self._queued.popleft()
                self._started()
                self._fail(flight, "no prefill worker is alive; the server cannot take requests", "no_worker")
                continue
            seq = flight.stream.seq
            entry = self.index.allocate(flight.rid, len(seq.prompt_token_ids), worker.index)
            if entry is None:
                return  # the store is full: wait for admissions to free blocks
            self._queued.popleft()
            self._started()
            flight.stage, flight.worker = "prefill", worker
            flight.deadline = time.monotonic() + self.disagg.transfer_timeout_s
            self._send(worker, Prefill(flight.rid, seq.prompt_token_ids, seq.params, entry.blocks, entry.state_slot))

    def _prefilled(self, message: Prefilled) -> None:
        rid = message.rid
        flight = self._flights.get(rid)
        if flight is None:  # aborted or failed meanwhile
            self.index.free(rid)
            return
        worker = self._least_loaded("decode")
        if worker is None:
            self.index.free(rid)
            self._flights.pop(rid)
            self._fail(flight, "no decode worker is alive; the request was prefilled but cannot be decoded",
                       "no_worker")
            return
        entry = self.index.entries[rid]
        entry.holder = worker.index
        flight.stage, flight.worker = "decode", worker
        flight.deadline = time.monotonic() + self.disagg.transfer_timeout_s
        seq = flight.stream.seq
        self._send(worker, Decode(rid, seq.prompt_token_ids, seq.params, message.first_token,
                                  message.generator_state, entry.blocks, entry.state_slot))

    def _deltas(self, deltas: list[TextDelta]) -> None:
        now = time.perf_counter()
        for delta in deltas:
            rid, tokens = delta.rid, delta.completion_tokens
            flight = self._flights.get(rid)
            if flight is None:
                continue
            if flight.last_token_time is None:
                self.metrics.ttft.observe(now - flight.stream.seq.arrival_time)
            else:
                self.metrics.itl.observe(now - flight.last_token_time)
            flight.last_token_time, flight.completion_tokens = now, tokens
            flight.deadline = time.monotonic() + self.disagg.transfer_timeout_s  # a stuck decode fails too
            if delta.finish_reason is not None:
                del self._flights[rid]
            self._post(flight, Delta(delta.text, tokens, delta.finish_reason))

    def _died(self, worker: WorkerHandle) -> None:
        """Fail every request the worker held; free the store entries it could still touch."""
        if not worker.alive:
            return
        worker.alive = False
        self.metrics.worker_deaths.labels(role=worker.role).inc()
        worker.process.join(1.0)
        why = f"left because {worker.cause}" if worker.cause else f"died (exit code {worker.process.exitcode})"
        message = f"{worker.name} {why}; the request was lost in {worker.role}; retry it"
        log.error("%s died (exit code %s)", worker.name, worker.process.exitcode)
        for flight in [f for f in self._flights.values() if f.worker is worker]:
            self._fail(flight, message, "worker_died")
        for rid in self.index.held_by(worker.index):
            self.index.free(rid)

    def _expire(self, now: float) -> None:
        for flight in [f for f in self._flights.values() if f.deadline < now]:
            what = ("prefill and KV transfer did not finish" if flight.stage == "prefill" else
                    "no token came" if flight.admitted else "no decode worker admitted it")
            self._fail(flight, f"{what} within transfer_timeout_s={self.disagg.transfer_timeout_s:g} s "
                               f"({flight.worker.name}); retry it", "timeout")
            self._leave(flight)

    def _leave(self, flight: Flight) -> None:
        """Tell the worker holding a flight to drop it (the entry is freed when it answers)."""
        if flight.worker is not None and flight.worker.alive:
            self._send(flight.worker, Abort(flight.rid))

    def _send(self, worker: WorkerHandle, message: ToWorker) -> None:
        """To a worker's pipe; a broken pipe means it died (its flights fail now, not at a timeout)."""
        if not worker.send(message):
            self._died(worker)

    def _fail(self, flight: Flight, message: str, cause: str) -> None:
        self._flights.pop(flight.rid, None)
        self.metrics.request_failures.labels(cause=cause).inc()
        self._post(flight, Delta("", flight.completion_tokens, None, error=message))

    def _started(self) -> None:
        self.admission.taken()

    def _least_loaded(self, role: str) -> WorkerHandle | None:
        live = [w for w in self.workers if w.role == role and w.alive]
        if not live:
            return None
        load = collections.Counter(f.worker.index for f in self._flights.values() if f.worker is not None)
        return min(live, key=lambda w: load[w.index])

    def _post(self, flight: Flight, delta: Delta) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            loop.call_soon_threadsafe(flight.stream.queue.put_nowait, delta)

    def _publish_gauges(self) -> None:
        for role in ("prefill", "decode"):
            self.metrics.workers_alive.labels(role=role).set(sum(w.alive for w in self.workers if w.role == role))
        stages = collections.Counter(f.stage for f in self._flights.values())
        layout, index = self.index.layout, self.index
        self.metrics.set_state(running=stages["decode"], waiting=stages["queued"] + stages["prefill"],
                               kv_blocks_used=layout.num_blocks - len(index.free_blocks),
                               kv_blocks_total=layout.num_blocks,
                               state_slots_used=layout.num_state_slots - len(index.free_slots),
                               state_slots_total=layout.num_state_slots)
