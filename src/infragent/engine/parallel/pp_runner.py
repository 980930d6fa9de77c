"""Pipeline parallelism (layer split): stage s holds a contiguous run of layers in its own process; rank 0
(stage 0, inside LLMEngine) schedules, prepares and embeds; hidden states flow stage to stage over gloo;
the last stage applies the final norm and the LM head and sends the step's tokens (or logits) to rank 0.

Micro-batching: a step's sequences are split into up to `micro_batches` groups, each prepared as its own
StepInputs; every stage runs them in the same order and hands each on without waiting (isend), so stage
s + 1 works on micro-batch i while stage s computes i + 1.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.layers import rms_norm
from infragent.engine.parallel.group import check_ranks, init_group, serve_steps, spawn_ranks, stop_ranks
from infragent.engine.runner import ModelRunner
from infragent.engine.sampling import sample
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.step_inputs import StepInputs
from infragent.trace import span

Plan = list[tuple[str, torch.Tensor]]  # ("greedy" | "full", rows of the micro-batch's hidden states)


def run_stage(model: DecoderModel, kv_cache: KVCache, kda_states: KDAStateCache | None, stage: int, stages: int,
              micro: list[tuple[StepInputs, Plan]], fresh_slots: list[int], vocab: int) -> list[list[torch.Tensor]]:
    """This stage's part of one step; rank 0 gets each micro-batch's plan results, other stages []."""
    if kda_states is not None:
        kda_states.reset(fresh_slots)
    pending, results = [], []
    for inputs, plan in micro:
        hidden = None
        if stage > 0:
            hidden = torch.empty(len(inputs.input_ids), model.shape.hidden_size, dtype=model.embed.dtype)
            dist.recv(hidden, src=stage - 1)
        hidden = model.forward(inputs, kv_cache, kda_states, hidden=hidden)
        if stage < stages - 1:
            hidden = hidden.contiguous()
            pending.append((dist.isend(hidden, dst=stage + 1), hidden))  # the tensor lives until sent
            continue
        outs = []
        for kind, rows in plan:
            x = rms_norm(hidden.index_select(0, rows), model.final_norm, model.shape.rms_eps)
            logits = model.lm_head(x).float()
            outs.append(logits.argmax(dim=-1) if kind == "greedy" else logits)
        if stage == 0:
            results.append(outs)
        else:
            pending += [(dist.isend(out, dst=0), out) for out in (o.contiguous() for o in outs)]
    if stage == 0 and stages > 1:
        for _, plan in micro:
            outs = [torch.empty(len(rows), dtype=torch.long) if kind == "greedy" else
                    torch.empty(len(rows), vocab) for kind, rows in plan]
            for out in outs:
                dist.recv(out, src=stages - 1)
            results.append(outs)
    for handle, _ in pending:
        handle.wait()
    return results


class PPModelRunner(ModelRunner):
    """Rank 0's runner under pipeline parallelism."""

    def __init__(self, *args, workers: list, stages: int, micro_batches: int, vocab: int,  # noqa: ANN002
                 **kwargs) -> None:  # noqa: ANN003
        super().__init__(*args, **kwargs)
        self.workers, self.stages, self.micro_batches, self.vocab = workers, stages, micro_batches, vocab

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        check_ranks(self.workers)
        fresh = self.slots.take_fresh() if self.slots is not None else []
        micro, owners = [], []
        with span("prepare", seqs=len(batch.seqs)):
            for part in _split(batch, self.micro_batches):
                inputs, sampled = self.prepare(part)
                plan: Plan = [("full", torch.arange(row, row + n)) for _, row, n, _ in self.prompt_rows]
                if sampled:
                    plan.append(("greedy" if all(s.params.greedy for s in sampled) else "full", inputs.logits_rows))
                micro.append((inputs, plan))
                owners.append((list(self.prompt_rows), sampled))
        with span("broadcast", seqs=len(batch.seqs)):
            dist.broadcast_object_list([("step", micro, fresh)], src=0)
        phase = "prefill" if any(inputs.prefills for inputs, _ in micro) else "decode"
        with span(phase, tokens=batch.num_tokens, micro_batches=len(micro)):
            results = run_stage(self.model, self.kv_cache, self.kda_states, 0, self.stages, micro, fresh, self.vocab)
        out: dict[int, list[int]] = {}
        for (prompt_rows, sampled), (_, plan), outs in zip(owners, micro, results):
            for (seq, _, _, position), logits in zip(prompt_rows, outs):
                seq.prompt_logprobs[position] = torch.log_softmax(logits, dim=-1)
            if sampled:
                last = outs[-1]
                tokens = last.tolist() if plan[-1][0] == "greedy" else sample(
                    last, [s.params for s in sampled], [s.generator for s in sampled])
                out.update({s.seq_id: [t] for s, t in zip(sampled, tokens)})
        return out

    def close(self) -> None:
        """Stop the stages and leave the group."""
        stop_ranks(self.workers)


def _split(batch: ScheduledBatch, parts: int) -> list[ScheduledBatch]:
    """Up to `parts` sub-batches of consecutive sequences, balanced by token count."""
    parts = max(1, min(parts, len(batch.seqs)))
    target = batch.num_tokens / parts
    out, current, tokens = [], ScheduledBatch(), 0
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        if current.seqs and tokens >= target and len(out) < parts - 1:
            out.append(current)
            current, tokens = ScheduledBatch(), 0
        current.seqs.append(seq)
        current.num_new_tokens.append(n)
        tokens += n
    out.append(current)
    return out


def start_stages(config, stages: int, num_blocks: int, block_size: int) -> tuple[list, int]:  # noqa: ANN001
    """Spawn stages 1..stages-1; returns them and the group's port (rank 0 joins next)."""
    return spawn_ranks(stage_main, "pp-stage", stages, config, num_blocks, block_size)


def stage_main(config, num_blocks: int, block_size: int, stage: int, stages: int, port: int) -> None:  # noqa: ANN001
    """A stage process: build its layers and caches, then run its part of every step until told to stop."""
    from infragent.engine.parallel.build import build_stage

    torch.set_num_threads(config.resolved_threads())
    model, kv_cache, kda_states, vocab = build_stage(config, stage, stages, num_blocks, block_size)
    init_group(stage, stages, port)
    serve_steps(lambda message: run_stage(model, kv_cache, kda_states, stage, stages, *message[1:], vocab))
