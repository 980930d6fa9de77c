"""LLMEngine: the step loop over what engine/build.py makes; add requests, step, collect outputs."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from infragent.engine.build import build_parts, give_back_freed_memory, quantize
from infragent.engine.config import EngineConfig
from infragent.engine.kv_transfer import KVStore, KVTransfer
from infragent.engine.outputs import RequestOutput, request_output
from infragent.engine.parallel.pp_runner import PPModelRunner
from infragent.engine.parallel.tp_runner import TPModelRunner
from infragent.engine.quant.corpus import token_windows
from infragent.engine.requests import make_sequence
from infragent.engine.sampling import RequestError, SamplingParams
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.sequence import Sequence, SequenceStatus
from infragent.engine.speculative.drafts import propose_drafts
from infragent.trace import counter, span


@dataclass
class StepUpdate:
    """What one step changed: sequences that received a token, and those of them that finished."""

    updated: list[Sequence]
    finished: list[Sequence]


class LLMEngine:
    """The serving engine core: continuous batching over a paged KV cache and KDA state slots."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts = build_parts(config)
        self.tokenizer, self.shape, self.model = parts.tokenizer, parts.shape, parts.model
        self.max_model_len = parts.max_model_len
        self.kv_cache, self.kda_states = parts.kv_cache, parts.kda_states
        self.blocks, self.slots, self.scheduler = parts.blocks, parts.slots, parts.scheduler
        self.runner, self.draft_model = parts.runner, parts.draft_model
        self.weight_choice = parts.weight_choice  # the weight_format this engine runs, and why
        self.prompt_tokens_computed = 0  # prompt positions run through the model (a prefix-cache hit or a fork: none)
        self.kv_store = self.kv_transfer = None
        if config.kv_transfer:
            self.attach_kv_store(KVStore(self.blocks.block_size, self.blocks.num_blocks * self.blocks.block_size))
        # disaggregation: after schedule, the prefill worker maps new blocks to the store's; after the forward
        # (KV landed) it pushes finished prefills' KDA states before their slots are freed
        self.on_scheduled: Callable[[ScheduledBatch], None] | None = None
        self.on_forward_done: Callable[[ScheduledBatch], None] | None = None
        if config.quantization is not None:
            quantize(self.model, config, self._run_calibration)
        give_back_freed_memory()

    def _run_calibration(self, windows: int = 8, window: int = 256) -> None:
        """Prefill calibration text (prefix caching off: no fp32 KV may outlive the calibration)."""
        caching, self.blocks.enable_prefix_caching = self.blocks.enable_prefix_caching, False
        try:
            length = min(window, self.max_model_len - 1)
            for ids in token_windows(self.tokenizer.encode, "calibration", length, windows):
                self.add_request(ids, SamplingParams(max_tokens=1))
            while self.has_unfinished():
                self.step()
        finally:
            self.blocks.enable_prefix_caching = caching

    def attach_kv_store(self, store: object, timeout_s: float = 60.0) -> KVTransfer:
        """Send every prefill layer's K/V to store on a transfer thread (config's mode and implementation)."""
        self.kv_store = store
        self.kv_transfer = KVTransfer(store, self.config.kv_transfer_impl, timeout_s)
        self.kv_cache.transfer, self.kv_cache.transfer_mode = self.kv_transfer, self.config.kv_transfer_mode
        return self.kv_transfer

    def close(self) -> None:
        """Stop what runs beside the engine: tensor-parallel workers, the KV transfer thread."""
        if isinstance(self.runner, (TPModelRunner, PPModelRunner)):
            self.runner.close()
        if self.kv_transfer is not None:
            self.kv_transfer.close()

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str = "") -> Sequence:
        """Validate and queue one request; raises RequestError naming the bad field."""
        seq = self.make_sequence(prompt, params, request_id)
        self.add_sequence(seq)
        return seq

    def make_sequence(self, prompt: str | list[int], params: SamplingParams | None = None,
                      request_id: str = "") -> Sequence:
        """Validate and tokenize one request without queueing it (safe to call off the engine thread)."""
        params = params or SamplingParams()
        parallel = max(self.config.lockstep_ranks, self.config.pipeline_parallel_size) > 1
        if parallel and (params.logprobs is not None or params.prompt_top_logprobs is not None
                         or params.adjusts_logits):
            raise RequestError("logprobs, penalties and min_tokens: not supported with tensor or pipeline "
                               "parallelism yet (its ranks return only tokens); leave them out or serve with "
                               "--tp 1 --pp 1")
        return make_sequence(self.tokenizer, self.shape.vocab_size, self.max_model_len, prompt, params, request_id)

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence made by make_sequence (FCFS); its forks (other choices) wait for its prompt."""
        self.scheduler.add(seq)

    def fork(self, seq: Sequence, n: int) -> list[Sequence]:
        """n - 1 more choices of a queued-to-be sequence (parallel sampling): each samples from the same
        prompt, computed once; seeds derived from seq's (seed + i), or fresh draws when it has none."""
        if max(self.config.lockstep_ranks, self.config.pipeline_parallel_size) > 1 and n > 1:
            raise RequestError("n: more than one choice is not served with tensor or pipeline parallelism yet")
        forks = []
        for i in range(1, n):
            params = replace(seq.params, seed=None if seq.params.seed is None else seq.params.seed + i)
            forks.append(Sequence(list(seq.prompt_token_ids), params, request_id=f"{seq.request_id}-{i}",
                                  prompt=seq.prompt, detokenizer=self.tokenizer.detokenizer()))
        seq.forks = forks
        return forks

    def abort(self, seq: Sequence) -> None:
        """Stop a request wherever it is; its KV blocks and state slot return to the free lists."""
        if seq.status is SequenceStatus.FINISHED:
            return
        owner = next((s for s in [*self.scheduler.waiting, *self.scheduler.running] if seq in s.forks), None)
        if owner is not None:  # a fork still waiting for its parent's prompt holds nothing yet
            owner.forks.remove(seq)
            seq.status = SequenceStatus.FINISHED
        else:
            for fork in seq.forks:  # the parent goes: forks that never started go with it
                fork.status, fork.finish_reason, fork.finish_time = SequenceStatus.FINISHED, "abort", time.perf_counter()
            seq.forks = []
            self.scheduler.abort(seq)
        seq.finish_reason = "abort"
        seq.finish_time = time.perf_counter()

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Run one scheduled batch; return the sequences that finished in it."""
        return self.step_updates().finished

    def step_updates(self) -> StepUpdate:
        """Run one scheduled batch; return the sequences that got a token and those that finished."""
        with span("step"):
            return self._step()

    def _step(self) -> StepUpdate:
        if self.config.speculative is not None:
            with span("draft"):
                propose_drafts(self.scheduler.running, self.config, self.draft_model, self.max_model_len)
        with span("schedule"):
            batch = self.scheduler.schedule()
        if not batch:
            return StepUpdate([], [])
        counter("running", len(self.scheduler.running))
        counter("waiting", len(self.scheduler.waiting))
        counter("kv_blocks_used", self.blocks.num_blocks - self.blocks.num_free_blocks)
        if self.on_scheduled is not None:
            self.on_scheduled(batch)
        sampled = self.runner.run(batch)
        if self.kv_transfer is not None:  # a prefill is done when its KV is in the store
            self.kv_cache.forward_done()
            self.kv_transfer.wait()
        if self.on_forward_done is not None:
            self.on_forward_done(batch)
        now = time.perf_counter()
        with span("detokenize", seqs=len(sampled)):
            return self._advance(batch, sampled, now)

    def _advance(self, batch: ScheduledBatch, sampled: dict[int, list[int]], now: float) -> StepUpdate:
        """Move each scheduled sequence forward: count computed tokens, append samples, detokenize, stop.

        A verification computed the last token and its drafts, but only the accepted ones count: the
        sequence's block table is cut back to them (the rejected drafts' KV is garbage past the end)."""
        updated, finished = [], []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            tokens = sampled.get(seq.seq_id)
            self.prompt_tokens_computed += max(0, min(seq.num_computed_tokens + n, len(seq.prompt_token_ids))
                                               - seq.num_computed_tokens)
            verified = self.runner.speculative and seq.num_computed_tokens == len(seq) - 1
            seq.num_computed_tokens += len(tokens) if verified and tokens else n
            seq.draft_token_ids = []
            if verified:
                self.blocks.truncate(seq, seq.num_computed_tokens)
            self.blocks.register_full_blocks(seq)
            if not tokens:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            if seq.forks and not seq.output_token_ids:
                self._start_forks(seq, now, updated, finished)
            updated.append(seq)
            if self.append_tokens(seq, tokens, now):
                finished.append(seq)
        return StepUpdate(updated, finished)

    def _start_forks(self, parent: Sequence, now: float, updated: list[Sequence], finished: list[Sequence]) -> None:
        """Start each fork from the parent's computed prompt, with the first token sampled beside the parent's;
        a fork with no room yet is queued to compute its prompt itself (and samples its first token again)."""
        for fork in parent.forks:
            copy = self.scheduler.admit_fork(parent, fork)
            if copy is False:
                fork.forked_token, fork.output_logprobs = None, []
                if fork.params.seed is not None:
                    fork.generator = torch.Generator().manual_seed(fork.params.seed)
                self.scheduler.add(fork)
                continue
            if copy is not None:
                self.kv_cache.copy_block(*copy)
            if self.kda_states is not None:
                self.kda_states.copy_slot(parent.state_slot, fork.state_slot)
            fork.first_token_time = now
            updated.append(fork)
            if self.append_tokens(fork, [fork.forked_token], now):
                finished.append(fork)
        parent.forks = []

    def append_tokens(self, seq: Sequence, tokens: list[int], now: float) -> bool:
        """Append sampled tokens, detokenizing and applying the stop rules; True when seq finished."""
        for token in tokens:
            seq.output_token_ids.append(token)
            seq.text += seq.detokenizer.add(token)
            reason = self._stop_reason(seq, token)
            if reason:
                del seq.output_logprobs[len(seq.output_token_ids):]  # accepted drafts past the stop
                seq.finish_reason, seq.finish_time = reason, now
                self.scheduler.finish(seq)
                return True
        return False

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if params.stop:
            hits = [seq.text.find(s) for s in params.stop if s in seq.text]
            if hits:
                seq.text = seq.text[:min(hits)]
                return "stop"
        if (token == self.tokenizer.eos_token_id and not params.ignore_eos) or token in params.stop_token_ids:
            reason = "stop"
        elif len(seq.output_token_ids) >= params.max_tokens or len(seq) >= self.max_model_len:
            reason = "length"
        else:
            return None
        seq.text += seq.detokenizer.flush()
        return reason

    def output(self, seq: Sequence) -> RequestOutput:
        """The RequestOutput of a finished sequence."""
        return request_output(seq)
