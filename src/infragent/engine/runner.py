"""ModelRunner: turns a ScheduledBatch into StepInputs, runs the model, samples next tokens."""
from __future__ import annotations

import torch

from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.sampling import sample
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.sequence import Sequence
from infragent.engine.state_slots import StateSlots
from infragent.engine.step_inputs import PrefillChunk, StepInputs
from infragent.trace import span


class ModelRunner:
    """Owns the model and its caches; one call to run() is one engine step."""

    def __init__(self, model: DecoderModel, kv_cache: KVCache, kda_states: KDAStateCache | None,
                 slots: StateSlots | None, block_size: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.kda_states = kda_states
        self.slots = slots
        self.block_size = block_size
        self.paged = kv_cache.layout == "paged"
        self.prompt_rows: list[tuple[Sequence, int, int, int]] = []  # this step's rows kept as prompt logprobs

    def prepare(self, batch: ScheduledBatch) -> tuple[StepInputs, list[Sequence]]:
        """Flatten the batch (decodes first) and build the metadata every layer reads."""
        order = sorted(range(len(batch.seqs)), key=lambda i: batch.num_new_tokens[i] != 1)
        seqs = [batch.seqs[i] for i in order]
        counts = [batch.num_new_tokens[i] for i in order]
        num_decodes = sum(1 for n in counts if n == 1)
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        prefills: list[PrefillChunk] = []
        logits_rows: list[int] = []
        sampled_seqs: list[Sequence] = []
        self.prompt_rows = []  # (seq, first row, rows, first position)
        for seq, n in zip(seqs, counts):
            start, row, table = seq.num_computed_tokens, len(input_ids), seq.block_table
            input_ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            slot_blocks.extend(table[p // bs] for p in range(start, start + n))
            if n > 1:
                # a lossy KV layer's attention reads the chunk back from the cache, so it needs the blocks
                context = torch.tensor(table) if self.paged and (start or self.kv_cache.any_lossy) else None
                prefills.append(PrefillChunk(row, n, start, context, table[0], seq.state_slot))
            if seq.params.prompt_logprobs and start < len(seq.prompt_token_ids):
                self.prompt_rows.append((seq, row, min(n, len(seq.prompt_token_ids) - start), start))
            if start + n == len(seq):
                logits_rows.append(row + n - 1)
                sampled_seqs.append(seq)
        position_tensor = torch.tensor(positions)
        inputs = StepInputs(
            input_ids=torch.tensor(input_ids), positions=position_tensor, slot_blocks=torch.tensor(slot_blocks),
            slot_offsets=position_tensor % bs, num_decodes=num_decodes, decode_blocks=None, decode_regions=None,
            decode_mask=None, decode_context_len=0, decode_state_slots=None, prefills=prefills,
            logits_rows=torch.tensor(logits_rows, dtype=torch.long))
        if num_decodes:
            self._prepare_decodes(inputs, seqs[:num_decodes])
        return inputs, sampled_seqs

    def _prepare_decodes(self, inputs: StepInputs, seqs: list[Sequence]) -> None:
        lengths = torch.tensor([s.num_computed_tokens + 1 for s in seqs])
        if self.paged:
            width = -(-int(lengths.max()) // self.block_size)
            inputs.decode_blocks = torch.tensor([b for s in seqs for b in s.block_table
                                                 + [0] * (width - len(s.block_table))])
            inputs.decode_context_len = width * self.block_size
        else:
            inputs.decode_regions = torch.tensor([s.block_table[0] for s in seqs])
            inputs.decode_context_len = int(lengths.max())
        if int(lengths.min()) != inputs.decode_context_len:
            pad = torch.arange(inputs.decode_context_len) >= lengths.unsqueeze(1)
            mask = torch.zeros(pad.shape, dtype=self.model.embed.dtype).masked_fill_(pad, float("-inf"))
            inputs.decode_mask = mask
        if self.slots is not None:
            inputs.decode_state_slots = torch.tensor([s.state_slot for s in seqs])

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> dict[int, int]:
        """Compute one step; return {seq_id: sampled token} for sequences that reached their last token."""
        with span("prepare", seqs=len(batch.seqs)):
            inputs, sampled_seqs = self.prepare(batch)
            if self.kda_states is not None and self.slots is not None:
                self.kda_states.reset(self.slots.take_fresh())
        tokens = len(inputs.input_ids)
        phase = "decode" if inputs.num_decodes == tokens else "prefill"  # a step with any prefill is a prefill step
        with span(phase, tokens=tokens, decodes=inputs.num_decodes, prefill_tokens=tokens - inputs.num_decodes):
            hidden = self.model.forward(inputs, self.kv_cache, self.kda_states)
        for seq, row, n, position in self.prompt_rows:  # a recomputed (preempted) prefix overwrites its rows
            seq.prompt_logprobs[position] = torch.log_softmax(self.model.logits(hidden[row:row + n]), dim=-1)
        if not sampled_seqs:
            return {}
        with span("sample", seqs=len(sampled_seqs)):
            logits = self.model.logits(hidden.index_select(0, inputs.logits_rows))
            tokens_out = sample(logits, [s.params for s in sampled_seqs], [s.generator for s in sampled_seqs])
        return {s.seq_id: t for s, t in zip(sampled_seqs, tokens_out)}
