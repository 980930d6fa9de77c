"""The worker processes of disaggregated serving, each an LLMEngine driven by messages from the router.

A prefill worker computes a prompt and its first token. Its transfer thread pushes each attention layer's
K/V into the request's store blocks as the layer finishes (layerwise) or after the forward; the step ends
when they have landed, then the KDA states go in and the router hears "prefilled". A decode worker copies a
request's K/V and states out of the store into its own cache when it has room (admission), appends the
first token and decodes, sending each step's text deltas.

Messages: engine/disagg/messages.py.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import multiprocessing
from multiprocessing.connection import Connection

import torch

from infragent.engine.config import EngineConfig
from infragent.engine.deltas import TextCursor
from infragent.engine.disagg.admission import admit_prefilled, fits
from infragent.engine.disagg.messages import (Abort, Admitted, AttachStore, Broken, Decode, Deltas, Dropped, Failed,
                                               Prefill, Prefilled, Ready, Released, Stop, TextDelta, ToWorker,
                                               WorkerInfo)
from infragent.engine.disagg.store import KVPool, SharedStore, StoreLayout
from infragent.engine.disagg.tcp_store import TCPStoreClient
from infragent.engine.kv_transfer import TransferTimeout
from infragent.engine.llm_engine import LLMEngine, StepUpdate
from infragent.engine.parallel.group import RankDiedError
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.sequence import Sequence

log = logging.getLogger("infragent.disagg")


def run_worker(role: str, config: EngineConfig, conn: Connection, timeout_s: float) -> None:
    """Process entry point: build the engine, report ready, attach the store, serve until stopped."""
    # the router starts its workers as daemons; an expert-parallel worker starts rank processes of its own,
    # which multiprocessing refuses a daemon (they are stopped with the engine, or die with this process)
    multiprocessing.current_process().daemon = False
    try:
        engine = LLMEngine(config)
    except Exception as err:  # the router reports it and does not wait for the ready message
        conn.send(Broken(f"{type(err).__name__}: {err}"))
        return
    shape = engine.shape
    kda = shape.num_kda_layers
    layout = StoreLayout(engine.blocks.num_blocks, engine.kv_cache.block_size, shape.num_attention_layers,
                         shape.num_kv_heads * shape.head_dim, config.max_num_seqs * 2,
                         (kda, shape.kda_num_heads, shape.kda_head_k_dim, shape.kda_head_v_dim) if kda else ())
    conn.send(Ready(WorkerInfo(layout, shape.vocab_size, engine.max_model_len)))
    try:
        with contextlib.suppress(EOFError, OSError):  # the router is gone: stop
            attach: AttachStore = conn.recv()
            store = connect(attach.address, timeout_s)
            worker = (PrefillWorker if role == "prefill" else DecodeWorker)(engine, store, conn, timeout_s)
            worker.serve()
    finally:
        engine.close()


def connect(address: tuple, timeout_s: float = 60.0) -> KVPool:
    """A worker's client for the store the router described: shared memory, or TCP."""
    if address[0] == "shm":
        return SharedStore(address[2], name=address[1])
    return TCPStoreClient(address[1], address[2], address[3], timeout_s)


class Worker:
    """The loop both roles share: take messages, step the engine, report."""

    role = "engine"

    def __init__(self, engine: LLMEngine, store: object, conn: Connection) -> None:
        self.engine, self.store, self.conn = engine, store, conn
        self.seqs: dict[str, Sequence] = {}

    def serve(self) -> None:
        """Until Stop or the router's end of the pipe closes."""
        while True:
            wait = 0.0 if self.engine.has_unfinished() or self.backlog() else 0.05
            while self.conn.poll(wait):
                message = self.conn.recv()
                if isinstance(message, Stop):
                    return
                self.handle(message)
                wait = 0.0
            self.before_step()
            if not self.engine.has_unfinished():
                continue
            try:
                update = self.engine.step_updates()
            except RankDiedError as err:  # this engine cannot run a step again: fail what is in flight and
                log.error("%s worker: %s", self.role, err)  # exit, so that the router routes around it
                self.fail_all(err)
                self.conn.send(Broken(f"its engine lost a rank: {err}"))
                return
            except Exception as err:  # fail what is in flight, keep serving
                log.exception("%s step failed", type(self).__name__)
                self.fail_all(err)
                continue
            self.after_step(update)

    def handle(self, message: ToWorker) -> None:
        """One router message (besides Stop)."""
        if isinstance(message, Abort):
            seq = self.seqs.pop(message.rid, None)
            if seq is not None:
                self.engine.abort(seq)
            self.conn.send(Dropped(message.rid))

    def backlog(self) -> bool:
        """Work waiting outside the engine."""
        return False

    def before_step(self) -> None:
        """Hook before each step."""

    def after_step(self, update: StepUpdate) -> None:
        """Report a step's results."""

    def fail_all(self, err: Exception) -> None:
        """Abort every request in flight and tell the router why."""
        for rid, seq in self.seqs.items():
            self.engine.abort(seq)
            self.conn.send(Failed(rid, f"{self.role} worker: {err}", True))
        self.seqs.clear()


class PrefillWorker(Worker):
    """Prompt → store blocks and state slot, and the first token."""

    role = "prefill"

    def __init__(self, engine: LLMEngine, store: object, conn: Connection, timeout_s: float) -> None:
        super().__init__(engine, store, conn)
        self.transfer = engine.attach_kv_store(store, timeout_s)
        self.transfer.block_map = torch.full((engine.blocks.num_blocks,), -1, dtype=torch.long)
        engine.on_scheduled, engine.on_forward_done = self._map_blocks, self._push_states
        self.entries: dict[str, tuple[list[int], int | None]] = {}
        self.fenced: list[str] = []  # failed on a transfer timeout: late rows may still land in their blocks

    def handle(self, message: ToWorker) -> None:
        if isinstance(message, Abort):
            if message.rid in self.fenced:
                return  # its blocks are freed by Released, once late rows can no longer land in them
            self.entries.pop(message.rid, None)
        if not isinstance(message, Prefill):
            return super().handle(message)
        rid = message.rid
        try:
            seq = self.engine.make_sequence(message.token_ids, dataclasses.replace(message.params, max_tokens=1), rid)
        except Exception as err:
            self.conn.send(Failed(rid, f"prefill worker: {err}", True))
            return
        self.entries[rid] = (message.blocks, message.state_slot)
        self.seqs[rid] = seq
        self.engine.add_sequence(seq)

    def before_step(self) -> None:
        if self.fenced and not self.transfer.busy():
            self.conn.send(Released(self.fenced))
            self.fenced = []

    def after_step(self, update: StepUpdate) -> None:
        for seq in update.finished:
            self.seqs.pop(seq.request_id, None)
            self.entries.pop(seq.request_id, None)
            state = bytes(seq.generator.get_state().numpy()) if seq.generator is not None else None
            self.conn.send(Prefilled(seq.request_id, seq.output_token_ids[0], state))

    def fail_all(self, err: Exception) -> None:
        self.engine.kv_cache.discard_unsent()  # rows of the failed forward not yet handed to the transfer
        if isinstance(err, TransferTimeout) or self.transfer.busy():
            # rows already published may still land: the store blocks stay held until the transfer drains
            self.fenced += list(self.seqs)
            for rid, seq in self.seqs.items():
                self.engine.abort(seq)
                self.conn.send(Failed(rid, f"prefill worker: {err}", False))
            self.seqs.clear()
        else:
            super().fail_all(err)
        self.entries.clear()

    def _map_blocks(self, batch: ScheduledBatch) -> None:
        """Point this step's engine blocks at the requests' store blocks (the transfer reads the map)."""
        for seq in batch.seqs:
            blocks = self.entries[seq.request_id][0]
            table = seq.block_table
            self.transfer.block_map[torch.tensor(table)] = torch.tensor(blocks[:len(table)])

    def _push_states(self, batch: ScheduledBatch) -> None:
        """KDA states of the prompts this step finished, before their slots are freed."""
        states = self.engine.kda_states
        if states is None:
            return
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.num_computed_tokens + n >= len(seq.prompt_token_ids):
                slot = self.entries[seq.request_id][1]
                self.store.put_state(slot, torch.stack([layer[seq.state_slot] for layer in states.states]))


class DecodeWorker(Worker):
    """Store → own cache on admission, then decode and stream."""

    role = "decode"

    def __init__(self, engine: LLMEngine, store: object, conn: Connection, timeout_s: float) -> None:
        super().__init__(engine, store, conn)
        self.pending: collections.OrderedDict[str, Decode] = collections.OrderedDict()
        self.cursors: dict[str, TextCursor] = {}

    def handle(self, message: ToWorker) -> None:
        if isinstance(message, Decode):
            self.pending[message.rid] = message
        elif isinstance(message, Abort) and self.pending.pop(message.rid, None) is not None:
            self.conn.send(Dropped(message.rid))
        else:
            if isinstance(message, Abort):
                self.cursors.pop(message.rid, None)
            super().handle(message)

    def backlog(self) -> bool:
        return bool(self.pending)

    def before_step(self) -> None:
        """Admit waiting requests in arrival order while there is room."""
        deltas = []
        while self.pending:
            rid, message = next(iter(self.pending.items()))
            try:
                seq = self.engine.make_sequence(message.token_ids, message.params, rid)
                if message.generator_state is not None:
                    seq.generator.set_state(torch.frombuffer(bytearray(message.generator_state), dtype=torch.uint8))
                if not fits(self.engine, seq):
                    break
                k, v = self.store.read(message.blocks, len(message.token_ids))
                state = self.store.read_state(message.state_slot) if message.state_slot is not None else None
                admit_prefilled(self.engine, seq, message.first_token, k, v, state)
            except Exception as err:
                del self.pending[rid]
                self.conn.send(Failed(rid, f"decode worker: admission failed: {err}", True))
                continue
            del self.pending[rid]
            self.conn.send(Admitted(rid))
            self.cursors[rid] = TextCursor(seq)
            deltas.append(self._delta(seq))
            if seq.finish_reason is None:
                self.seqs[rid] = seq
        if deltas:
            self.conn.send(Deltas(deltas))

    def after_step(self, update: StepUpdate) -> None:
        deltas = [self._delta(seq) for seq in update.updated if seq.request_id in self.cursors]
        for seq in update.finished:
            self.seqs.pop(seq.request_id, None)
        if deltas:
            self.conn.send(Deltas(deltas))

    def fail_all(self, err: Exception) -> None:
        super().fail_all(err)
        self.cursors.clear()

    def _delta(self, seq: Sequence) -> TextDelta:
        finished = seq.finish_reason is not None
        delta = (self.cursors.pop(seq.request_id) if finished else self.cursors[seq.request_id]).next_delta(finished)
        return TextDelta(seq.request_id, delta.text, delta.completion_tokens, delta.finish_reason)
