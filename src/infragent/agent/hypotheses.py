"""Hypotheses: testable claims about where time or error goes, each with its locality (spans, knobs, thread,
kernel), the cheapest probe that could refute it, and its prediction (Amdahl: removing a span saves at most
its share). A hypothesis is posed open and settled by the probe it names: supported, refuted or
inconclusive. Here also: hypotheses from a trace's analysis.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from infragent.analysis.idle import NO_SPAN, RECURRING_SHARE, pair_words
from infragent.lab.spec import Knob, Spec
from infragent.probes.feedback import Feedback

TOP_SHARE = 0.08  # spans below this share of busy time are not worth a hypothesis


@dataclass
class Hypothesis:
    """One testable claim."""

    claim: str
    spans: list[str]
    knobs: list[str]
    probe: str  # the cheapest probe that could refute it
    predicted: str  # the effect it predicts, as an upper bound where one exists
    evidence: list[str] = field(default_factory=list)
    cites: dict[str, float] = field(default_factory=dict)  # "LEDGER_KEY:path/in/its/feedback" -> the number
    locality: dict[str, str] = field(default_factory=dict)  # thread, kernel, file: where a change should go
    key: str = ""  # its ledger key, hypothesis/N
    status: str = "open"  # open | supported | refuted | inconclusive
    settled_by: str = ""  # the ledger key of the probe record that settled it
    verdict: str = ""  # that probe's finding, as it bears on the claim

    def settle(self, status: str, record_key: str, finding: str) -> "Hypothesis":
        """Mark the hypothesis supported, refuted or inconclusive by the probe record at record_key."""
        self.status, self.settled_by, self.verdict = status, record_key, finding
        return self


def closed_knobs(hypotheses: list[Hypothesis]) -> list[str]:
    """Knobs that only refuted hypotheses point at."""
    alive = {k for h in hypotheses if h.status != "refuted" for k in h.knobs}
    return [k for h in hypotheses if h.status == "refuted" for k in h.knobs if k not in alive]


def from_analysis(analysis: Feedback, knobs: dict[str, Knob]) -> list[Hypothesis]:
    """Hypotheses from an `analyze` Feedback: top spans, time in no child span or in no span at all (recurring
    gaps), never-overlapping pairs, and a GPU trace's own (the GPU waiting on the host → CUDA graphs, larger
    batches, fusion, fewer syncs; copies in the open), each with the knobs whose names say they can move it."""
    found: list[Hypothesis] = []
    own_time = {s["span"]: s for s in analysis.details.get("self_time", [])}
    for row in analysis.details.get("top_spans", []):
        if row["share"] < TOP_SHARE:
            continue
        own = own_time.get(row["key"])
        if own is not None:  # its time is between its children, in code no span names
            where = f" ({', '.join(own['code'])})" if own.get("code") else ""
            found.append(Hypothesis(
                claim=f"{row['key']!r} holds {own['share']:.0%} of busy time in no child span: code between its "
                      f"children{where} that no span names (a sleep, a sort, a sync?)",
                spans=[row["key"]], knobs=[], probe="roofline",
                predicted=f"at most {own['share']:.0%} less busy time if that code vanished (Amdahl bound)",
                evidence=[f"breakdown: {row['key']} own time {own['self_ns'] / 1e6:.1f} ms of "
                          f"{own['inclusive_ns'] / 1e6:.1f} ms, children {', '.join(own['children'][:4])}"],
                locality={"code": ", ".join(own.get("code", []))} if own.get("code") else {}))
            continue
        touching = [n for n, k in knobs.items() if row["key"] in k.touches]
        found.append(Hypothesis(
            claim=f"{row['key']!r} takes {row['share']:.0%} of busy time"
                  + (f"; {', '.join(touching)} act on it" if touching else "; no declared knob acts on it"),
            spans=[row["key"]], knobs=touching, probe="local_ab" if touching else "roofline",
            predicted=f"at most {row['share']:.0%} less busy time if {row['key']!r} vanished (Amdahl bound)",
            evidence=[f"breakdown: {row['key']} exclusive {row['exclusive_ns'] / 1e6:.1f} ms"]))
    found += from_recurring_gaps(analysis.details.get("idle", []))
    for pair in analysis.details.get("never_overlapping", []):
        found.append(Hypothesis(
            claim=f"{pair['a']} never runs while {pair['b']} does: one thread starves (GIL or a lock)",
            spans=[pair["a"].split(" @ ")[0], pair["b"].split(" @ ")[0]], knobs=[], probe="gil",
            predicted="overlapping them hides the shorter one's time",
            evidence=[f"overlap {pair['overlap_ns'] / 1e6:.2f} ms of {pair['a_busy_ns'] / 1e6:.1f} ms"]))
    for gpu in analysis.details.get("gpu", {}).get("hypotheses", []):
        words = gpu.get("knob_words", [])
        moving = [n for n, k in knobs.items() if any(w in x.lower() for w in words for x in [n, *k.touches])]
        found.append(Hypothesis(claim=gpu["claim"], spans=[], knobs=moving,
                                probe="local_ab" if moving else gpu["probe"],
                                predicted=gpu["predicted"], evidence=list(gpu["evidence"]),
                                locality={"remedy": gpu["remedy"], "bound": gpu["kind"]}))
    return found


def from_recurring_gaps(tracks: list[dict]) -> list[Hypothesis]:
    """A thread idle a large share of its window in gaps that recur between the same two spans (every engine
    step, say): code in no span at all, or a wait there. One hypothesis, for the most idle thread."""
    for track in tracks:
        if track["kind"] != "thread" or track["idle_ns"] < TOP_SHARE * max(track["active_ns"], 1):
            continue
        top = (track.get("between") or [None])[0]
        if top is None or top["gaps"] < 3 or top["idle_ns"] < RECURRING_SHARE * track["idle_ns"]:
            continue
        share = top["idle_ns"] / max(track["active_ns"], 1)
        return [Hypothesis(
            claim=f"{track['track']} spends {share:.0%} of its time {pair_words(top['before'], top['after'])}, in no "
                  f"span at all ({top['gaps']} gaps, median {top['median_ns'] / 1e6:.3g} ms): code between those "
                  "spans that no span names, or a wait there (a sleep, a sync, a lock?)",
            spans=list(dict.fromkeys([top["before"], top["after"], NO_SPAN])), knobs=[], probe="roofline",
            predicted=f"at most {share:.0%} less wall time on that thread if the gaps vanished (Amdahl bound)",
            evidence=[f"idle: {track['track']} {top['idle_ns'] / 1e6:.1f} ms in {top['gaps']} gaps between "
                      f"{top['before']!r} and {top['after']!r} of {track['active_ns'] / 1e6:.1f} ms active"])]
    return []


def from_scheduling(found: dict | None, knobs: dict[str, Knob]) -> list[Hypothesis]:
    """Hypotheses from how the scheduler shaped a traced run: prefill cut into chunks at the token budget (the
    max_num_batched_tokens knob), requests waiting while the batch is full (max_num_seqs)."""
    if not found:
        return []
    out = []
    chunked = found["steps_at_budget"]
    if found["prefill_steps"] and chunked / found["prefill_steps"] >= 0.5 and chunked >= 2:
        per = found["prefill_tokens"] / max(found["prefill_steps"], 1)
        out.append(Hypothesis(
            claim=f"prefill is cut into chunks of {found['token_budget']} tokens (max_num_batched_tokens): "
                  f"{chunked} of {found['prefill_steps']} prefill steps hit the budget ({per:.0f} tokens per step), "
                  f"{found['step_share']:.0%} of step time in prefill",
            spans=["prefill", "schedule"], knobs=[n for n in knobs if n == "max_num_batched_tokens"],
            probe="local_ab", predicted="a larger token budget needs fewer, fuller prefill steps: a lower TTFT",
            cites={"ladder/trace:details/scheduling/steps_at_budget": chunked,
                   "ladder/trace:details/scheduling/prefill_steps": found["prefill_steps"]}))
    if found["samples"] and found["waiting_samples"] / found["samples"] >= 0.2:
        out.append(Hypothesis(
            claim=f"requests wait for a slot: the batch is full at max_num_seqs = {found['seq_limit']} while others "
                  f"wait in {found['waiting_samples']} of {found['samples']} steps",
            spans=["decode", "schedule"], knobs=[n for n in knobs if n == "max_num_seqs"], probe="local_ab",
            predicted="more sequences per step serve the queue sooner: lower TTFT and more goodput",
            cites={"ladder/trace:details/scheduling/waiting_samples": found["waiting_samples"]}))
    return out


def suspects(hypotheses: list[Hypothesis]) -> list[str]:
    """Span names under suspicion (those with knobs first)."""
    ordered = [h for h in hypotheses if h.knobs] + [h for h in hypotheses if not h.knobs]
    return [s for h in ordered for s in h.spans]


def engine_workload(spec: Spec, knobs: dict, prompts: int = 6, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs shaped like the first scenario, for an offline traced run."""
    scenario = spec.scenarios[0]
    rng = random.Random(seed)
    spread = scenario.random_range_ratio
    out = []
    for _ in range(prompts):
        n = max(1, round(scenario.random_input_len * (1 + spread * (2 * rng.random() - 1))))
        out.append(([rng.randrange(1000, 40000) for _ in range(n)], scenario.random_output_len))
    return out
