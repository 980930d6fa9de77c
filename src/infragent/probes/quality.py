"""The quality gates: a candidate engine (quantized weights or KV cache) against a reference (fp32) on the
real model. Perplexity on held-out English text, the mean KL divergence of the next-token distributions at
every position of that text, and greedy agreement on prompts cut from it.

    perplexity_increase  exp(mean NLL_candidate − mean NLL_reference) − 1, paired per text window
    kl_divergence        mean over positions of KL(p_reference ‖ p_candidate), nats
    greedy_agreement     per prompt, the share of the reference's greedy tokens the candidate reproduced
                         before its first different token; mean over prompts

Each comes with a bootstrap CI over windows (or prompts) and the raw per-window samples as evidence.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import numpy as np
import torch

from infragent.analysis.stats import bootstrap_mean
from infragent.engine.config import EngineConfig
from infragent.engine.llm import LLM
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.quant.corpus import token_windows
from infragent.engine.sampling import SamplingParams
from infragent.probes.artifacts import save_json
from infragent.probes.budget import over_budget
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.machine import free_cores

QUALITY_METRICS = ("perplexity_increase", "kl_divergence", "greedy_agreement")


@dataclass
class QualityPlan:
    """How much text the gates read: windows × window tokens for perplexity and KL, prompts for agreement."""

    windows: int = 32
    window: int = 256
    prompts: int = 64
    prompt_tokens: int = 32
    max_tokens: int = 16
    batch: int = 8  # windows scored at once: each keeps [window, vocab] fp32 log-probabilities per side


@dataclass
class QualitySamples:
    """Raw per-window and per-prompt numbers, what every estimate and CI is computed from."""

    nll_reference: list[float]  # mean NLL per window
    nll_candidate: list[float]
    kl: list[float]  # mean KL per window
    agreement: list[float]  # per prompt
    exact: list[bool]  # per prompt: the whole greedy continuation identical
    stopped: bool = False  # the budget ended the scoring before the plan's windows and prompts were done


def quality_samples(reference: LLMEngine, candidate: LLMEngine, plan: QualityPlan | None = None,
                    until: float | None = None) -> QualitySamples:
    """Score the held-out windows and the prompts on both engines (engines must be idle), a batch at a time;
    no batch starts that the last one's time says would end past time.monotonic() `until` (at least one
    batch of each is scored)."""
    plan = plan or QualityPlan()
    encode = reference.tokenizer.encode
    out = QualitySamples([], [], [], [], [])
    last = {"start": time.monotonic(), "took": 0.0}

    def late(done: int) -> bool:
        now = time.monotonic()
        last["took"], last["start"] = (now - last["start"] if done > 0 else 0.0), now
        if done > 0 and until is not None and now + last["took"] > until:
            out.stopped = True
            return True
        return False

    windows = token_windows(encode, "evaluation", plan.window, plan.windows)
    for start in range(0, len(windows), plan.batch):
        if late(start):
            break
        batch = windows[start:start + plan.batch]
        for ids, lp_r, lp_c in zip(batch, _prompt_logprobs(reference, batch), _prompt_logprobs(candidate, batch)):
            targets = torch.tensor(ids[1:])
            out.nll_reference.append(float(-lp_r[:-1].gather(1, targets[:, None]).mean()))
            out.nll_candidate.append(float(-lp_c[:-1].gather(1, targets[:, None]).mean()))
            out.kl.append(float((lp_r.exp() * (lp_r - lp_c)).sum(dim=1).mean()))
    prompts = [w[:plan.prompt_tokens] for w in token_windows(encode, "evaluation", plan.prompt_tokens, plan.prompts)]
    greedy = SamplingParams(max_tokens=plan.max_tokens, temperature=0.0, ignore_eos=True)
    for start in range(0, len(prompts), plan.batch):
        if late(start):
            break
        batch = prompts[start:start + plan.batch]
        ref_out = LLM.from_engine(reference).generate(batch, greedy)
        cand_out = LLM.from_engine(candidate).generate(batch, greedy)
        for r, c in zip(ref_out, cand_out):
            out.agreement.append(_common_prefix(r.token_ids, c.token_ids) / len(r.token_ids))
            out.exact.append(r.token_ids == c.token_ids)
    return out


def quality(reference: LLMEngine, candidate: LLMEngine, plan: QualityPlan | None = None,
            label: str = "candidate") -> Feedback:
    """The three gates with CIs, as a Feedback (verdict pass: measured; criteria judge the numbers)."""
    samples = quality_samples(reference, candidate, plan)
    return quality_feedback(samples, label)


def quality_feedback(samples: QualitySamples, label: str = "candidate") -> Feedback:
    """Estimates and bootstrap CIs from raw samples; the samples are kept as evidence."""
    diff = np.asarray(samples.nll_candidate) - np.asarray(samples.nll_reference)
    d = bootstrap_mean(diff.tolist())
    kl = bootstrap_mean(samples.kl)
    agree = bootstrap_mean(samples.agreement)
    ppl_r, ppl_c = float(np.exp(np.mean(samples.nll_reference))), float(np.exp(np.mean(samples.nll_candidate)))
    numbers = {
        "perplexity_reference": Measure(ppl_r, n=len(diff)),
        "perplexity_candidate": Measure(ppl_c, n=len(diff)),
        "perplexity_increase": Measure(float(np.expm1(d.center)), "", float(np.expm1(d.lo)), float(np.expm1(d.hi)),
                                       d.n),
        "kl_divergence": Measure(kl.center, "nats", kl.lo, kl.hi, kl.n),
        "greedy_agreement": Measure(agree.center, "", agree.lo, agree.hi, agree.n),
        "greedy_exact": Measure(float(np.mean(samples.exact)), n=len(samples.exact)),
    }
    evidence = save_json("quality", asdict(samples), f"{label}: per-window NLL and KL, per-prompt agreement")
    finding = (f"{label}: perplexity {ppl_c:.3f} vs {ppl_r:.3f} ({numbers['perplexity_increase'].text()}), "
               f"KL {kl.center:.2e} nats, greedy agreement {agree.center:.3f} "
               f"({sum(samples.exact)}/{len(samples.exact)} continuations identical)")
    return Feedback("quality", "pass", finding, numbers=numbers, evidence=[evidence],
                    details={"windows": len(diff), "prompts": len(samples.agreement)})


def _prompt_logprobs(engine: LLMEngine, windows: list[list[int]]) -> list[torch.Tensor]:
    """[window, vocab] log-probabilities at every position of each window."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=True)
    return [out.prompt_logprobs for out in LLM.from_engine(engine).generate(windows, params)]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@contextmanager
def untimed_threads(configs: list[EngineConfig]) -> Iterator[tuple[list[EngineConfig], str]]:
    """The configs unchanged on a quiet machine; where other processes keep cores busy, those that name no
    thread count get the free cores (machine.free_cores) divided among their ranks, with a note for the
    finding. The process's torch thread count is restored afterwards (building an engine sets it). The gates
    are not timed, so the thread count changes only how long they take."""
    before = torch.get_num_threads()
    free, cores = free_cores(), len(os.sched_getaffinity(0))
    if free < cores:
        configs = [c if c.num_threads is not None else
                   replace(c, num_threads=max(1, free // (c.lockstep_ranks * c.pipeline_parallel_size)))
                   for c in configs]
    note = (f" (scored on {free} free core{'s' if free > 1 else ''}: other processes kept {cores - free} of "
            f"{cores} busy)") if free < cores else ""
    try:
        yield configs, note
    finally:
        torch.set_num_threads(before)


def quality_of(model: str, knobs: dict[str, Any], plan: QualityPlan | None = None,
               budget_s: float | None = None) -> Feedback:
    """The quality gates of an engine configuration (knobs: quantization, KV-cache dtypes) against fp32; past
    budget_s (loading included) it scores no further batch and answers, inconclusive, from what it has."""
    from infragent.engine.build import kv_cache_gb_for

    start = time.monotonic()
    plan = plan or QualityPlan()
    length = max(plan.window, 64) + 32
    reference_config = EngineConfig(model=model, max_model_len=length)
    # a batch of windows at a time: a cache that holds one batch at full length, not the serving default
    room = {"kv_cache_gb": kv_cache_gb_for(reference_config, (plan.batch + 1) * length)}
    configs = [EngineConfig(model=model, max_model_len=length, **{**room, **knobs}), replace(reference_config, **room)]
    with untimed_threads(configs) as (configs, note):
        candidate, reference = (LLMEngine(config) for config in configs)
        label = " ".join(f"{k}={v}" for k, v in knobs.items() if v not in (None, "auto")) or "fp32"
        samples = quality_samples(reference, candidate, plan, None if budget_s is None else start + budget_s)
    feedback = quality_feedback(samples, label)
    feedback.finding += note
    if samples.stopped:
        had = f"{len(samples.kl)} of {plan.windows} windows and {len(samples.agreement)} of {plan.prompts} prompts"
        return over_budget(feedback, budget_s or 0.0, time.monotonic() - start, had)
    return feedback
