"""LLMEngine: wires config, model, caches, scheduler and runner; add requests, step, collect outputs."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from infragent.engine.block_manager import BlockManager
from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.gguf_weights import read_gguf
from infragent.engine.kv_cache import KDAStateCache, KVCache, kv_formats
from infragent.engine.kv_transfer import KVStore, KVTransfer
from infragent.engine.kernels.build import use_native_kernels
from infragent.engine.native_gemm import make_gemm
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.hybrid import init_hybrid
from infragent.engine.models.llama import load_llama
from infragent.engine.models.spec import ModelSpec
from infragent.engine.outputs import RequestOutput
from infragent.engine.parallel.build import caches, shard_model, stage_model
from infragent.engine.parallel.pp_runner import PPModelRunner, start_stages
from infragent.engine.parallel.group import init_group
from infragent.engine.parallel.tp_runner import TPModelRunner, start_workers
from infragent.engine.quant.apply import quantize_projections
from infragent.engine.quant.corpus import token_windows
from infragent.engine.quant.smoothquant import input_ranges, smoothing_factors
from infragent.engine.runner import ModelRunner
from infragent.engine.sampling import RequestError, SamplingParams, TokenLogprob
from infragent.engine.scheduler import ScheduledBatch, Scheduler
from infragent.engine.spec_decode.draft_model import DraftModel
from infragent.engine.spec_decode.ngram import propose_ngram
from infragent.engine.spec_decode.rollback import ReplayRollback, SnapshotRollback
from infragent.engine.sequence import Sequence, SequenceStatus
from infragent.engine.state_slots import StateSlots
from infragent.engine.tokenizer import Tokenizer
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
        torch.set_num_threads(config.resolved_threads())
        gguf = read_gguf(config.gguf_path)  # header parsed once, shared by tokenizer and weights
        self.tokenizer = Tokenizer.from_reader(gguf)
        if config.model == "llama":
            spec, weights = load_llama(gguf)
        else:
            spec, weights = init_hybrid(config.hybrid, self.tokenizer.vocab_size)
        self.spec = spec
        world, stages = config.tensor_parallel_size, config.pipeline_parallel_size
        if world > 1:  # this process is rank 0: its shard, and the driver of the others
            self.model = shard_model(config, spec, weights, 0, world)
        elif stages > 1:  # rank 0 is the first pipeline stage
            self.model = stage_model(config, spec, weights, 0, stages)
        else:
            self.model = DecoderModel(spec, weights, config.torch_dtype)
            self.model.use_gemm(make_gemm(config.gemm))
            self.model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
        del weights
        self.max_model_len = config.max_model_len or min(spec.max_position_embeddings, 4096)
        if self.max_model_len > spec.max_position_embeddings:
            raise ConfigError(f"max_model_len: {self.max_model_len} exceeds the model's context "
                              f"({spec.max_position_embeddings}); lower it")
        local = self.model.spec  # a shard's head counts under tensor parallelism
        formats, block_size, num_blocks = self._size_kv_cache(local)
        if stages == 1:  # a pipeline stage allocates only its own layers' share (below)
            self.kv_cache = KVCache(local.num_attention_layers, num_blocks, block_size, local.num_kv_heads,
                                    local.head_dim, config.torch_dtype, config.kv_layout, formats)
            self.kv_cache.kernels = self.model.kernels = use_native_kernels(config.kernels, config.torch_dtype,
                                                                            local.kernel_sizes())
        prefix_caching = config.enable_prefix_caching
        if prefix_caching is None:
            prefix_caching = spec.num_kda_layers == 0 and config.kv_layout == "paged"
        elif prefix_caching and (spec.num_kda_layers or config.kv_layout != "paged"):
            raise ConfigError("enable_prefix_caching: needs the paged layout and a model without KDA layers "
                              "(KDA state is not cached per block); turn it off")
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching)
        self.slots = StateSlots(config.max_num_seqs) if spec.num_kda_layers else None
        if stages > 1:  # the blocks and slots of one process; each stage stores only its own layers' share
            self.kv_cache, self.kda_states = caches(config, self.model, num_blocks, block_size)
        else:
            self.kda_states = (KDAStateCache(local.num_kda_layers, config.max_num_seqs, local.kda_num_heads,
                                             local.kda_head_k_dim, local.kda_head_v_dim) if self.slots else None)
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens, self.blocks, self.slots)
        self.prompt_tokens_computed = 0  # prompt positions run through the model (a prefix-cache hit or a fork: none)
        if world > 1:
            workers, port = start_workers(config, world, num_blocks, block_size)
            init_group(0, world, port)
            self.runner: ModelRunner = TPModelRunner(self.model, self.kv_cache, self.kda_states, self.slots,
                                                     block_size, workers=workers)
        elif stages > 1:
            workers, port = start_stages(config, stages, num_blocks, block_size)
            init_group(0, stages, port)
            self.runner = PPModelRunner(self.model, self.kv_cache, self.kda_states, self.slots, block_size,
                                        workers=workers, stages=stages, micro_batches=config.pp_micro_batches,
                                        vocab=spec.vocab_size)
        else:
            self.runner = ModelRunner(self.model, self.kv_cache, self.kda_states, self.slots, block_size,
                                      speculative=config.speculative is not None)
        self.draft_model = None
        if config.speculative == "draft":
            if config.draft_layers >= spec.num_layers:
                raise ConfigError(f"draft_layers: {config.draft_layers} is not fewer than the model's "
                                  f"{spec.num_layers} layers; a draft model must be smaller")
            self.draft_model = DraftModel(self.model, config.draft_layers, config.draft_window,
                                          config.num_speculative_tokens)
        if config.speculative is not None and self.kda_states is not None:
            rollback = ReplayRollback if config.rollback == "replayssm" else SnapshotRollback
            self.kda_states.rollback = rollback(self.kda_states.states, config.resolved_rollback_window())
        self.kv_store = self.kv_transfer = None
        if config.kv_transfer:
            self.attach_kv_store(KVStore(block_size, num_blocks * block_size))
        # disaggregation: after schedule, the prefill worker maps new blocks to the store's; after the forward
        # (KV landed) it pushes finished prefills' KDA states before their slots are freed
        self.on_scheduled: Callable[[ScheduledBatch], None] | None = None
        self.on_forward_done: Callable[[ScheduledBatch], None] | None = None
        if config.quantization is not None:
            self._quantize()

    def attach_kv_store(self, store: object, timeout_s: float = 60.0) -> KVTransfer:
        """Send every prefill layer's K/V to store on a transfer thread (config's mode and implementation)."""
        self.kv_store = store
        self.kv_transfer = KVTransfer(store, self.config.kv_transfer_impl, timeout_s)
        self.kv_cache.transfer, self.kv_cache.transfer_mode = self.kv_transfer, self.config.kv_transfer_mode
        return self.kv_transfer

    def _size_kv_cache(self, spec: ModelSpec) -> tuple[list, int, int]:
        """Size the attention KV cache from kv_cache_gb; returns (layer formats, block_size, num_blocks)."""
        cfg = self.config
        formats = kv_formats(cfg.layer_kv_dtypes(spec.num_attention_layers))
        model_element = torch.finfo(cfg.torch_dtype).bits // 8
        block_size = cfg.block_size if cfg.kv_layout == "paged" else self.max_model_len
        row = spec.num_kv_heads * spec.head_dim
        # per token: K and V rows in each layer's format, plus (scaled formats) a K and V scale per head and block
        per_token = sum(2 * row * (f.element_size if f else model_element)
                        + (2 * spec.num_kv_heads * 4 / block_size if f and f.scaled else 0) for f in formats)
        capacity = int(cfg.kv_cache_gb * 1e9 // max(per_token, 1))
        num_blocks = capacity // block_size
        if num_blocks * block_size < self.max_model_len or num_blocks == 0:
            raise ConfigError(f"kv_cache_gb: {cfg.kv_cache_gb} GB holds {capacity} tokens, fewer than "
                              f"max_model_len={self.max_model_len}; raise kv_cache_gb or lower max_model_len")
        return formats, block_size, num_blocks

    def _quantize(self) -> None:
        """Quantize the projections; with smoothquant_alpha, first calibrate activation ranges on held-out text."""
        smooth = None
        alpha = self.config.smoothquant_alpha
        if alpha is not None:
            ranges = input_ranges(self.model, self._run_calibration)
            smooth = [smoothing_factors(amax, getattr(owner, name).weight_t, alpha)
                      for amax, (owner, name) in zip(ranges, self.model.projections())]
        quantize_projections(self.model, self.config.quantization, smooth)

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
        parallel = max(self.config.tensor_parallel_size, self.config.pipeline_parallel_size) > 1
        if parallel and (params.logprobs is not None or params.prompt_top_logprobs is not None
                         or params.adjusts_logits):
            raise RequestError("logprobs, penalties and min_tokens: not supported with tensor or pipeline "
                               "parallelism yet (its ranks return only tokens); leave them out or serve with "
                               "--tp 1 --pp 1")
        return make_sequence(self.tokenizer, self.spec.vocab_size, self.max_model_len, prompt, params, request_id)

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence made by make_sequence (FCFS); its forks (other choices) wait for its prompt."""
        self.scheduler.add(seq)

    def fork(self, seq: Sequence, n: int) -> list[Sequence]:
        """n - 1 more choices of a queued-to-be sequence (parallel sampling): each samples from the same
        prompt, computed once; seeds derived from seq's (seed + i), or fresh draws when it has none."""
        if max(self.config.tensor_parallel_size, self.config.pipeline_parallel_size) > 1 and n > 1:
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
                self._draft()
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
            if self._append(seq, tokens, now):
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
            if self._append(fork, [fork.forked_token], now):
                finished.append(fork)
        parent.forks = []

    def _append(self, seq: Sequence, tokens: list[int], now: float) -> bool:
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

    def can_admit(self, seq: Sequence) -> bool:
        """Whether a request prefilled elsewhere fits now (a running place, blocks for its prompt)."""
        return self.scheduler.can_admit_running(seq, len(seq.prompt_token_ids))

    def admit_prefilled(self, seq: Sequence, first_token: int, k: torch.Tensor, v: torch.Tensor,
                        kda_state: torch.Tensor | None) -> None:
        """Admit a request prefilled elsewhere (check can_admit first): its prompt's K/V rows (k, v:
        [attention layers, prompt, row]), its KDA states [kda layers, heads, dk, dv] and its first token."""
        n = seq.num_computed_tokens = len(seq.prompt_token_ids)
        self.scheduler.admit_running(seq)
        size = self.kv_cache.block_size
        positions = torch.arange(n)
        blocks, offsets = torch.tensor(seq.block_table)[positions // size], positions % size
        heads = self.spec.num_kv_heads
        for layer in range(k.shape[0]):
            self.kv_cache.fill(layer, k[layer].view(n, heads, -1), v[layer].view(n, heads, -1), blocks, offsets)
        if kda_state is not None:
            self.kda_states.reset([seq.state_slot])  # a speculative rollback's history starts here too
            for layer, state in enumerate(self.kda_states.states):
                state[seq.state_slot] = kda_state[layer]
        seq.first_token_time = time.perf_counter()
        self._append(seq, [first_token], seq.first_token_time)

    def _draft(self) -> None:
        """Propose drafts for every running greedy sequence past its prompt (n-gram lookup or draft model)."""
        cfg = self.config
        for seq in self.scheduler.running:
            if seq.num_computed_tokens != len(seq) - 1 or not seq.params.greedy or seq.params.adjusts_logits:
                continue
            room = min(seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len - len(seq)) - 1
            k = min(cfg.num_speculative_tokens, room)
            if self.draft_model is not None:
                seq.draft_token_ids = self.draft_model.propose(seq.token_ids, k) if k > 0 else []
            else:
                seq.draft_token_ids = propose_ngram(seq.token_ids, k, cfg.prompt_lookup_max, cfg.prompt_lookup_min)

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
        return RequestOutput(
            request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(seq.output_token_ids), text=seq.text, finish_reason=seq.finish_reason,
            arrival_time=seq.arrival_time, first_token_time=seq.first_token_time, finish_time=seq.finish_time,
            num_cached_tokens=seq.num_cached_tokens, num_preemptions=seq.num_preemptions,
            prompt_logprobs=_prompt_logprobs(seq), logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None
            else None, prompt_top_logprobs=prompt_top_logprobs(seq))


def make_sequence(tokenizer: Tokenizer, vocab_size: int, max_model_len: int, prompt: str | list[int],
                  params: SamplingParams | None = None, request_id: str = "") -> Sequence:
    """Validate and tokenize one request (RequestError names the bad field)."""
    params = replace(params) if params is not None else SamplingParams()  # resolved per request, below
    params.validate()
    if isinstance(prompt, str):
        token_ids, text = tokenizer.encode(prompt), prompt
    else:
        token_ids, text = list(prompt), None
    if not token_ids:
        raise RequestError("prompt: is empty; give at least one token")
    bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"prompt: token id {bad!r} is outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise RequestError(f"prompt: {len(token_ids)} tokens does not fit the context "
                           f"(max_model_len={max_model_len}, one position is needed to generate); "
                           f"shorten the prompt")
    room = max_model_len - len(token_ids)
    if params.max_tokens is None:
        params.max_tokens = room
    elif params.strict_context and params.max_tokens > room:
        raise RequestError(f"max_tokens: this model's context is {max_model_len} tokens; the prompt has "
                           f"{len(token_ids)}, so at most {room} can be generated, not {params.max_tokens}; "
                           "lower max_tokens or shorten the prompt")
    if params.min_tokens > params.max_tokens:
        raise RequestError(f"min_tokens: {params.min_tokens} is more than max_tokens={params.max_tokens}")
    if params.min_tokens:
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        params.banned_until_min = sorted({t for t in params.stop_token_ids + eos if t < vocab_size})
    return Sequence(token_ids, params, request_id=request_id, prompt=text, detokenizer=tokenizer.detokenizer())


def prompt_top_logprobs(seq: Sequence) -> list[TokenLogprob] | None:
    """With params.prompt_top_logprobs: prompt tokens 1.. each with its log-probability and alternatives, in
    order, each position once (a preempted sequence recomputes its prefix, possibly in other chunks)."""
    if seq.params.prompt_top_logprobs is None:
        return None
    rows: list[TokenLogprob] = []
    for position in sorted(seq.prompt_top):
        chunk = seq.prompt_top[position]
        rows += chunk[len(rows) - position:] if position + len(chunk) > len(rows) else []
    return rows


def _prompt_logprobs(seq: Sequence) -> torch.Tensor | None:
    """The prompt's log-probability rows in position order, each position once (a preempted sequence
    recomputes its prefix, possibly in other chunks)."""
    if not seq.prompt_logprobs:
        return None
    rows, covered = [], 0
    for position in sorted(seq.prompt_logprobs):
        chunk = seq.prompt_logprobs[position]
        if position + len(chunk) > covered:
            rows.append(chunk[covered - position:])
            covered = position + len(chunk)
    return torch.cat(rows)
