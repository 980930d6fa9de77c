"""The worker processes of disaggregated serving, each an LLMEngine driven by messages from the router.

A prefill worker computes a prompt and its first token. Its transfer thread pushes each attention layer's
K/V into the request's store blocks as the layer finishes (layerwise) or after the forward; the step ends
when they have landed, then the KDA states go in and the router hears "prefilled". A decode worker copies a
request's K/V and states out of the store into its own cache when it has room (admission), appends the
first token and decodes, sending each step's text deltas.

Messages (tuples over a multiprocessing Pipe):
  router → worker  ("store", spec) once; ("prefill", rid, token_ids, params, blocks, state_slot);
                   ("decode", rid, token_ids, params, first_token, generator_state, blocks, state_slot);
                   ("abort", rid); ("stop",)
  worker → router  ("ready", info) | ("broken", message) once; ("prefilled", rid, first_token, generator_state);
                   ("admitted", rid); ("dropped", rid); ("deltas", [(rid, text, tokens, finish_reason)]);
                   ("failed", rid, message, released); ("released", [rid])
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from multiprocessing.connection import Connection

import torch

from infragent.engine.config import EngineConfig
from infragent.engine.deltas import TextCursor
from infragent.engine.disagg.store import StoreLayout, connect
from infragent.engine.kv_transfer import TransferTimeout
from infragent.engine.llm_engine import LLMEngine, StepUpdate
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.sequence import Sequence

log = logging.getLogger("infragent.disagg")


def run_worker(role: str, config: EngineConfig, conn: Connection, timeout_s: float) -> None:
    """Process entry point: build the engine, report ready, attach the store, serve until stopped."""
    try:
        engine = LLMEngine(config)
    except Exception as err:  # the router reports it and does not wait for the ready message
        conn.send(("broken", f"{type(err).__name__}: {err}"))
        return
    spec = engine.spec
    kda = spec.num_kda_layers
    layout = StoreLayout(engine.blocks.num_blocks, engine.kv_cache.block_size, spec.num_attention_layers,
                         spec.num_kv_heads * spec.head_dim, config.max_num_seqs * 2,
                         (kda, spec.kda_num_heads, spec.kda_head_k_dim, spec.kda_head_v_dim) if kda else ())
    conn.send(("ready", {"layout": layout, "vocab_size": spec.vocab_size, "max_model_len": engine.max_model_len}))
    try:
        with contextlib.suppress(EOFError, OSError):  # the router is gone: stop
            _, store_spec = conn.recv()
            store = connect(store_spec, timeout_s)
            worker = (PrefillWorker if role == "prefill" else DecodeWorker)(engine, store, conn, timeout_s)
            worker.serve()
    finally:
        engine.close()


class Worker:
    """The loop both roles share: take messages, step the engine, report."""

    role = "engine"

    def __init__(self, engine: LLMEngine, store: object, conn: Connection) -> None:
        self.engine, self.store, self.conn = engine, store, conn
        self.seqs: dict[str, Sequence] = {}

    def serve(self) -> None:
        """Until ("stop",) or the router's end of the pipe closes."""
        while True:
            wait = 0.0 if self.engine.has_unfinished() or self.backlog() else 0.05
            while self.conn.poll(wait):
                message = self.conn.recv()
                if message[0] == "stop":
                    return
                self.handle(message)
                wait = 0.0
            self.before_step()
            if not self.engine.has_unfinished():
                continue
            try:
                update = self.engine.step_updates()
            except Exception as err:  # fail what is in flight, keep serving
                log.exception("%s step failed", type(self).__name__)
                self.fail_all(err)
                continue
            self.after_step(update)

    def handle(self, message: tuple) -> None:
        """One router message (besides stop)."""
        if message[0] == "abort":
            seq = self.seqs.pop(message[1], None)
            if seq is not None:
                self.engine.abort(seq)
            self.conn.send(("dropped", message[1]))

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
            self.conn.send(("failed", rid, f"{self.role} worker: {err}", True))
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

    def handle(self, message: tuple) -> None:
        if message[0] == "abort":
            if message[1] in self.fenced:
                return  # its blocks are freed by "released", once late rows can no longer land in them
            self.entries.pop(message[1], None)
        if message[0] != "prefill":
            return super().handle(message)
        _, rid, token_ids, params, blocks, state_slot = message
        try:
            seq = self.engine.make_sequence(token_ids, dataclasses.replace(params, max_tokens=1), rid)
        except Exception as err:
            self.conn.send(("failed", rid, f"prefill worker: {err}", True))
            return
        self.entries[rid] = (blocks, state_slot)
        self.seqs[rid] = seq
        self.engine.add_sequence(seq)

    def before_step(self) -> None:
        if self.fenced and not self.transfer.busy():
            self.conn.send(("released", self.fenced))
            self.fenced = []

    def after_step(self, update: StepUpdate) -> None:
        for seq in update.finished:
            self.seqs.pop(seq.request_id, None)
            self.entries.pop(seq.request_id, None)
            state = bytes(seq.generator.get_state().numpy()) if seq.generator is not None else None
            self.conn.send(("prefilled", seq.request_id, seq.output_token_ids[0], state))

    def fail_all(self, err: Exception) -> None:
        self.engine.kv_cache.discard_unsent()  # rows of the failed forward not yet handed to the transfer
        if isinstance(err, TransferTimeout) or self.transfer.busy():
            # rows already published may still land: the store blocks stay held until the transfer drains
            self.fenced += list(self.seqs)
            for rid, seq in self.seqs.items():
                self.engine.abort(seq)
                self.conn.send(("failed", rid, f"prefill worker: {err}", False))
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
        self.pending: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self.cursors: dict[str, TextCursor] = {}

    def handle(self, message: tuple) -> None:
        if message[0] == "decode":
            self.pending[message[1]] = message[2:]
        elif message[0] == "abort" and self.pending.pop(message[1], None) is not None:
            self.conn.send(("dropped", message[1]))
        else:
            self.cursors.pop(message[1], None)
            super().handle(message)

    def backlog(self) -> bool:
        return bool(self.pending)

    def before_step(self) -> None:
        """Admit waiting requests in arrival order while there is room."""
        deltas = []
        while self.pending:
            rid, (token_ids, params, first_token, generator_state, blocks, state_slot) = next(iter(self.pending.items()))
            try:
                seq = self.engine.make_sequence(token_ids, params, rid)
                if generator_state is not None:
                    seq.generator.set_state(torch.frombuffer(bytearray(generator_state), dtype=torch.uint8))
                if not self.engine.can_admit(seq):
                    break
                k, v = self.store.read(blocks, len(token_ids))
                state = self.store.read_state(state_slot) if state_slot is not None else None
                self.engine.admit_prefilled(seq, first_token, k, v, state)
            except Exception as err:
                del self.pending[rid]
                self.conn.send(("failed", rid, f"decode worker: admission failed: {err}", True))
                continue
            del self.pending[rid]
            self.conn.send(("admitted", rid))
            self.cursors[rid] = TextCursor(seq)
            deltas.append(self._delta(seq))
            if seq.finish_reason is None:
                self.seqs[rid] = seq
        if deltas:
            self.conn.send(("deltas", deltas))

    def after_step(self, update: StepUpdate) -> None:
        deltas = [self._delta(seq) for seq in update.updated if seq.request_id in self.cursors]
        for seq in update.finished:
            self.seqs.pop(seq.request_id, None)
        if deltas:
            self.conn.send(("deltas", deltas))

    def fail_all(self, err: Exception) -> None:
        super().fail_all(err)
        self.cursors.clear()

    def _delta(self, seq: Sequence) -> tuple:
        finished = seq.finish_reason is not None
        delta = (self.cursors.pop(seq.request_id) if finished else self.cursors[seq.request_id]).next_delta(finished)
        return (seq.request_id, delta.text, delta.completion_tokens, delta.finish_reason)
