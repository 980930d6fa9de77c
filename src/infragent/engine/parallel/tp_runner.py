"""Tensor- and expert-parallel execution: rank 0 (the driver, inside LLMEngine) schedules and prepares each
step, sends the step's inputs to the workers, and every rank runs its shard of the same forward; partial sums
meet in all-reduces, MoE tokens in all-to-alls (expert.py), and the LM head picks greedy tokens without
gathering the vocabulary.

Every rank runs `execute` with the same plan, so the collectives line up: the plan lists which hidden rows
need full logits (sampling, prompt log-probabilities) and which only a greedy token.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.layers import rms_norm
from infragent.engine.parallel.build import build_shard
from infragent.engine.parallel.group import (RankDiedError, check_ranks, init_group, serve_steps, spawn_ranks,
                                             stop_ranks)
from infragent.engine.parallel.layers import VocabParallelHead
from infragent.engine.runner import ModelRunner
from infragent.engine.sampling import sample
from infragent.engine.scheduler import ScheduledBatch
from infragent.engine.step_inputs import StepInputs
from infragent.trace import span

Plan = list[tuple[str, torch.Tensor]]  # ("greedy" | "full", hidden rows)


def execute(model: DecoderModel, kv_cache: KVCache, kda_states: KDAStateCache | None, inputs: StepInputs,
            fresh_slots: list[int], plan: Plan) -> list[torch.Tensor]:
    """One step on this rank: the forward, then each plan entry (greedy tokens or full logits)."""
    if kda_states is not None:
        kda_states.reset(fresh_slots)
    hidden = model.forward(inputs, kv_cache, kda_states)
    split_head = isinstance(model.lm_head, VocabParallelHead)
    if not split_head and dist.get_rank() > 0:  # a whole LM head (expert parallelism alone): rank 0's answer
        return []
    results = []
    for kind, rows in plan:
        x = rms_norm(hidden.index_select(0, rows), model.final_norm, model.shape.rms_eps)
        if kind == "full":
            results.append(model.lm_head(x).float())
        else:
            results.append(model.lm_head.greedy(x) if split_head else model.lm_head(x).float().argmax(dim=1))
    return results


class TPModelRunner(ModelRunner):
    """Rank 0's runner: prepares, broadcasts, executes its shard, samples."""

    def __init__(self, *args, workers: list, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.workers = workers

    def run(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        check_ranks(self.workers)
        try:
            return self._run(batch)
        except RankDiedError:
            raise
        except Exception:
            check_ranks(self.workers, grace_s=1.0)  # a collective that failed because a rank died: name the rank
            raise

    @torch.inference_mode()
    def _run(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        with span("prepare", seqs=len(batch.seqs)):
            inputs, sampled_seqs = self.prepare(batch)
            fresh = self.slots.take_fresh() if self.slots is not None else []
        plan: Plan = [("full", torch.arange(row, row + n)) for _, row, n, _ in self.prompt_rows]
        if sampled_seqs:
            greedy = all(s.params.greedy for s in sampled_seqs)
            plan.append(("greedy" if greedy else "full", inputs.logits_rows))
        with span("broadcast", seqs=len(batch.seqs)):
            dist.broadcast_object_list([("step", inputs, fresh, plan)], src=0)
        phase = "prefill" if inputs.prefills else "decode"
        with span(phase, tokens=len(inputs.input_ids), decodes=inputs.num_decodes):
            results = execute(self.model, self.kv_cache, self.kda_states, inputs, fresh, plan)
        for (seq, _, _, position), logits in zip(self.prompt_rows, results):
            seq.prompt_logprobs[position] = torch.log_softmax(logits, dim=-1)
        if not sampled_seqs:
            return {}
        last = results[-1]
        if plan[-1][0] == "greedy":
            tokens = last.tolist()
        else:
            tokens = sample(last, [s.params for s in sampled_seqs], [s.generator for s in sampled_seqs])
        return {s.seq_id: [t] for s, t in zip(sampled_seqs, tokens)}

    def close(self) -> None:
        """Stop the workers and leave the group."""
        stop_ranks(self.workers)


def start_workers(config, world: int, num_blocks: int, block_size: int) -> tuple[list, int]:  # noqa: ANN001
    """Spawn ranks 1..world-1 (named ep-rank-N under expert parallelism alone, else tp-rank-N); returns them
    and the group's port (rank 0 joins next)."""
    name = "ep-rank" if config.tensor_parallel_size == 1 else "tp-rank"
    return spawn_ranks(worker_main, name, world, config, num_blocks, block_size)


def worker_main(config, num_blocks: int, block_size: int, rank: int, world: int, port: int) -> None:  # noqa: ANN001
    """A worker rank: build the shard and its caches, then run every step rank 0 sends until told to stop."""
    torch.set_num_threads(config.resolved_threads())
    model, kv_cache, kda_states = build_shard(config, rank, world, num_blocks, block_size)
    init_group(rank, world, port)
    serve_steps(lambda message: execute(model, kv_cache, kda_states, *message[1:]))
