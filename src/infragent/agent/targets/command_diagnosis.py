"""A command target's baseline diagnosed from outside, as `infragent diagnose` sees any server: its bottlenecks
become hypotheses, each aimed at the spec's knobs that declare they act on it (`acts_on`). The search then
turns only those knobs; a candidate that wins supports the hypothesis, repeated non-wins refute it and close
its knobs, as for the engine's traced spans.
"""
from __future__ import annotations

from typing import Callable

from infragent.agent.hypotheses import Hypothesis
from infragent.lab.spec import Spec
from infragent.probes.diagnose import DiagnoseConfig
from infragent.probes.feedback import Feedback

DIAGNOSE_S = 10.0  # of load on the baseline while it is read


def diagnose_config(spec: Spec, base_url: str, pgid: int | None) -> DiagnoseConfig:
    """The diagnosis load shaped like the spec's first scenario, against the baseline's launch."""
    scenario = spec.scenarios[0]
    return DiagnoseConfig(base_url, pgid=pgid, seconds=DIAGNOSE_S, concurrency=scenario.max_concurrency or 16,
                          input_len=scenario.random_input_len, output_len=scenario.random_output_len)


class CommandDiagnostics:
    """The baseline's launch diagnosed from outside; hypotheses from its bottlenecks."""

    observe = ["diagnose"]

    def __init__(self, spec: Spec, diagnose: Callable[[], Feedback]) -> None:
        self.spec = spec
        self.probes: dict[str, Callable[[], Feedback]] = {"diagnose": diagnose}

    def pose(self, results: dict[str, dict]) -> list[Hypothesis]:
        """One hypothesis per bottleneck that something acts on, aimed at the knobs that declare it."""
        found = results.get("ladder/diagnose")
        if found is None:
            return []
        posed = []
        for b in found.get("details", {}).get("bottlenecks", []):
            if not b["acts_on"]:
                continue
            knobs = [n for n, k in self.spec.knobs.items() if set(k.acts_on) & set(b["acts_on"])]
            moving = f"; {', '.join(knobs)} act on it" if knobs else \
                f"; no knob declares acts_on {' or '.join(b['acts_on'])}"
            posed.append(Hypothesis(
                claim=b["claim"] + moving, spans=list(b["acts_on"]), knobs=knobs,
                probe="local_ab" if knobs else "diagnose",
                predicted=b["fix"] or "moving it lifts the bound the evidence shows",
                evidence=list(b["evidence"]), locality={"question": f"diagnose:{b['kind']}", "remedy": b["fix"]}))
        return posed

    def settle(self, probe: str, hypothesis: Hypothesis, results: dict[str, dict]) -> Hypothesis:
        """Candidates settle these; one no knob can test stays inconclusive (the diagnosis cannot decide it)."""
        return hypothesis
