"""ModelRunner: turns a ScheduledBatch into StepInputs, runs the model, samples next tokens."""
from __future__ import annotations

import enum

import torch

from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.sampling import sample, token_logprobs
from infragent.engine.speculative.verify import accept_greedy
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.sequence import Sequence
from infragent.engine.state_slots import StateSlots
from infragent.engine.step_inputs import PrefillChunk, StepInputs
from infragent.trace import span


class RowKind(enum.IntEnum):
    """How a sequence's rows run this step, in the order the batch is flattened."""

    DECODE = 0  # one new token
    VERIFY = 1  # the last token and its drafts, checked at once
    PREFILL = 2  # a prompt chunk


class ModelRunner:
    """Owns the model and its caches; one call to run() is one engine step."""

    def __init__(self, model: DecoderModel, kv_cache: KVCache, kda_states: KDAStateCache | None,
                 slots: StateSlots | None, block_size: int, speculative: bool = False) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.kda_states = kda_states
        self.slots = slots
        self.block_size = block_size
        self.paged = kv_cache.layout == "paged"
        # speculative: every sequence past its prompt runs as a verification (its drafts may be none)
        self.speculative = speculative
        self.verify_rows: list[tuple[Sequence, int, int]] = []  # this step's verifications: (seq, row, rows)
        self.speculative_stats = {"verifications": 0, "drafted": 0, "accepted": 0}  # since the engine started
        self.prompt_rows: list[tuple[Sequence, int, int, int]] = []  # this step's rows kept as prompt logprobs

    def prepare(self, batch: ScheduledBatch) -> tuple[StepInputs, list[Sequence]]:
        """Flatten the batch (decodes, then verifications, then prompt chunks) and build the metadata every
        layer reads. Attention runs a verification's rows as decodes, each row seeing the context up to its
        own position; KDA runs them token by token with a rollback (inputs.verifies)."""
        verifying = [self.speculative and s.num_computed_tokens == len(s) - 1 for s in batch.seqs]
        kind = [RowKind.VERIFY if v else RowKind.DECODE if n == 1 else RowKind.PREFILL
                for n, v in zip(batch.num_new_tokens, verifying)]
        order = sorted(range(len(batch.seqs)), key=lambda i: kind[i])
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        prefills: list[PrefillChunk] = []
        verifies: list[PrefillChunk] = []
        decode_rows: list[tuple[Sequence, int]] = []  # (seq, context length) of each attention decode row
        logits_rows: list[int] = []
        sampled_seqs: list[Sequence] = []
        self.verify_rows = []
        self.prompt_rows = []  # (seq, first row, rows, first position)
        sending = self.kv_cache.transfer is not None
        transfer_rows: list[int] = []  # rows at prompt positions, whichever way they run (a 1-token chunk decodes)
        for i in order:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            start, row, table = seq.num_computed_tokens, len(input_ids), seq.block_table
            if sending:
                transfer_rows.extend(range(row, row + max(0, min(n, len(seq.prompt_token_ids) - start))))
            input_ids.extend((seq.token_ids + seq.draft_token_ids)[start:start + n])
            positions.extend(range(start, start + n))
            slot_blocks.extend(table[p // bs] for p in range(start, start + n))
            if kind[i] is not RowKind.PREFILL:  # attention runs a verification's rows as decodes
                decode_rows += [(seq, p + 1) for p in range(start, start + n)]
            if kind[i] is RowKind.VERIFY:
                verifies.append(PrefillChunk(row, n, start, None, table[0], seq.state_slot))
                self.verify_rows.append((seq, row, n))
                continue
            if kind[i] is RowKind.PREFILL:
                # a lossy KV layer's attention reads the chunk back from the cache, so it needs the blocks
                context = torch.tensor(table) if self.paged and (start or self.kv_cache.any_lossy) else None
                prefills.append(PrefillChunk(row, n, start, context, table[0], seq.state_slot))
            if seq.params.wants_prompt_rows and start < len(seq.prompt_token_ids):
                self.prompt_rows.append((seq, row, min(n, len(seq.prompt_token_ids) - start), start))
            if start + n == len(seq):
                logits_rows.append(row + n - 1)
                sampled_seqs.append(seq)
        position_tensor = torch.tensor(positions)
        inputs = StepInputs(
            input_ids=torch.tensor(input_ids), positions=position_tensor, slot_blocks=torch.tensor(slot_blocks),
            slot_offsets=position_tensor % bs, num_decodes=len(decode_rows), decode_blocks=None,
            decode_regions=None, decode_mask=None, decode_context_len=0, decode_state_slots=None,
            prefills=prefills, logits_rows=torch.tensor(logits_rows, dtype=torch.long), verifies=verifies,
            transfer_rows=torch.tensor(transfer_rows, dtype=torch.long) if transfer_rows else None)
        if decode_rows:
            self._prepare_decodes(inputs, decode_rows)
        return inputs, sampled_seqs

    def _prepare_decodes(self, inputs: StepInputs, rows: list[tuple[Sequence, int]]) -> None:
        """Block tables, padding mask and state slots of the decode rows."""
        lengths = inputs.decode_context_lens = torch.tensor([length for _, length in rows])
        if self.paged:
            width = -(-int(lengths.max()) // self.block_size)
            inputs.decode_blocks = torch.tensor([b for s, _ in rows for b in s.block_table[:width]
                                                 + [0] * (width - len(s.block_table))])
            inputs.decode_context_len = width * self.block_size
        else:
            inputs.decode_regions = torch.tensor([s.block_table[0] for s, _ in rows])
            inputs.decode_context_len = int(lengths.max())
        if int(lengths.min()) != inputs.decode_context_len:
            pad = torch.arange(inputs.decode_context_len) >= lengths.unsqueeze(1)
            mask = torch.zeros(pad.shape, dtype=self.model.embed.dtype).masked_fill_(pad, float("-inf"))
            inputs.decode_mask = mask
        if self.slots is not None:
            state_rows = len(rows) - inputs.num_verify_rows
            inputs.decode_state_slots = torch.tensor([s.state_slot for s, _ in rows[:state_rows]])

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        """Compute one step; return {seq_id: new tokens} for sequences that reached their last token (one
        token, or for a verification the accepted drafts and the token after them)."""
        with span("prepare", seqs=len(batch.seqs)):
            inputs, sampled_seqs = self.prepare(batch)
            if self.kda_states is not None and self.slots is not None:
                self.kda_states.reset(self.slots.take_fresh())
        tokens = len(inputs.input_ids)
        phase = "prefill" if inputs.prefills else "decode"  # verifications are decodes
        with span(phase, tokens=tokens, decodes=inputs.num_decodes, prefill_tokens=tokens - inputs.num_decodes):
            hidden = self.model.forward(inputs, self.kv_cache, self.kda_states)
        for seq, row, n, position in self.prompt_rows:  # a recomputed (preempted) prefix overwrites its rows
            self._keep_prompt_rows(seq, self.model.logits(hidden[row:row + n]), position)
        out: dict[int, list[int]] = {}
        if sampled_seqs:
            with span("sample", seqs=len(sampled_seqs)):
                logits = self.model.logits(hidden.index_select(0, inputs.logits_rows))
                tokens_out = sample(logits, [s.params for s in sampled_seqs], [s.generator for s in sampled_seqs],
                                    [s.output_token_ids for s in sampled_seqs])
                for i, (seq, token) in enumerate(zip(sampled_seqs, tokens_out)):
                    if seq.params.logprobs is not None:
                        seq.output_logprobs += token_logprobs(logits[i:i + 1], [token], seq.params.logprobs)
                    if seq.forks and not seq.output_token_ids:  # the prompt is done: the other choices' firsts
                        self._sample_forks(seq, logits[i:i + 1])
            out = {s.seq_id: [t] for s, t in zip(sampled_seqs, tokens_out)}
        if self.verify_rows:
            with span("verify", seqs=len(self.verify_rows)):
                out.update(self._verify(hidden))
        return out

    @staticmethod
    def _sample_forks(parent: Sequence, row: torch.Tensor) -> None:
        """Each fork's first token from the parent's last prompt row, with the fork's own params and seed."""
        forks = parent.forks
        firsts = sample(row.expand(len(forks), -1), [f.params for f in forks], [f.generator for f in forks],
                        [[] for _ in forks])
        for fork, token in zip(forks, firsts):
            fork.forked_token = token
            if fork.params.logprobs is not None:
                fork.output_logprobs = token_logprobs(row, [token], fork.params.logprobs)

    @staticmethod
    def _keep_prompt_rows(seq: Sequence, logits: torch.Tensor, position: int) -> None:
        """Keep what the request asked of the prompt rows [position, position + n): whole log-softmax rows,
        and/or each next prompt token's log-probability with the top alternatives."""
        if seq.params.prompt_logprobs:
            seq.prompt_logprobs[position] = torch.log_softmax(logits, dim=-1)
        k = seq.params.prompt_top_logprobs
        if k is not None:
            following = seq.prompt_token_ids[position + 1:position + 1 + len(logits)]  # the last row has none
            seq.prompt_top[position] = token_logprobs(logits[:len(following)], following, k) if following else []

    def _verify(self, hidden: torch.Tensor) -> dict[int, list[int]]:
        """Accept each verification's drafts greedily; KDA state keeps only the accepted tokens."""
        out = {}
        rows = torch.cat([torch.arange(row, row + n) for _, row, n in self.verify_rows])
        all_logits = self.model.logits(hidden.index_select(0, rows)).split([n for _, _, n in self.verify_rows])
        for (seq, row, n), logits in zip(self.verify_rows, all_logits):
            drafts = seq.draft_token_ids[:n - 1]
            if drafts:
                tokens = accept_greedy(logits, drafts)
                self.speculative_stats["drafted"] += len(drafts)
                self.speculative_stats["accepted"] += len(tokens) - 1
            else:  # nothing drafted (or no room): an ordinary decode of the last row, any sampling
                tokens = sample(logits[-1:], [seq.params], [seq.generator], [seq.output_token_ids])
            if seq.params.logprobs is not None:
                rows = logits[:len(tokens)] if drafts else logits[-1:]
                seq.output_logprobs += token_logprobs(rows, tokens, seq.params.logprobs)
            if self.kda_states is not None and self.kda_states.rollback is not None:
                self.kda_states.rollback.commit(seq.state_slot, len(tokens))
            out[seq.seq_id] = tokens
        self.speculative_stats["verifications"] += len(self.verify_rows)
        return out
