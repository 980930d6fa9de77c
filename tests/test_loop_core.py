"""The loop's core pieces on their own: the search proposer behind the Proposer interface (never the baseline,
never a tried point, done when the space is), the diagnosis dispatching the cheapest probe that can refute
each open hypothesis (next_probes posing the next), and hypotheses and candidates as their own records."""
from __future__ import annotations

from pathlib import Path

import pytest

from infragent.agent.context import Budget, RunContext
from infragent.agent.diagnosis import diagnose
from infragent.agent.dispatch import cost_of, probes_in
from infragent.agent.hypotheses import Hypothesis
from infragent.agent.proposal import ProposalContext, SearchDone
from infragent.agent.proposers.search import SearchProposer
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Knob, Spec
from infragent.lab.trajectory import best_of, chains
from infragent.probes.feedback import Feedback


def context(trials: list[dict], baseline: dict, hypotheses: list[Hypothesis] | None = None) -> ProposalContext:
    return ProposalContext({}, hypotheses or [], trials, baseline)


def test_search_never_proposes_the_baseline_or_a_tried_point_and_ends_when_the_space_does() -> None:
    knobs = {"tile": Knob(type="choice", domain=[16, 32, 64], default=32, touches=["kda"])}
    search = SearchProposer(knobs, seed=1)
    trials: list[dict] = []
    for _ in range(2):
        proposal = search.propose(context(trials, {"tile": 32}))
        assert proposal.knobs["tile"] != 32 and proposal.knobs not in [t["knobs"] for t in trials]
        result = {"trial": len(trials), "knobs": proposal.knobs, "status": "measured", "objective": 1.0,
                  "feasible": True}
        trials.append(result)
        search.tell(result)
    with pytest.raises(SearchDone, match="every combination"):
        search.propose(context(trials, {"tile": 32}))


def test_search_learns_replayed_results_and_a_refuted_direction_closes_its_knobs() -> None:
    knobs = {"seqs": Knob(type="int", domain=[1, 8], default=1, touches=["decode"]),
             "threads": Knob(type="int", domain=[1, 2], default=1, touches=["mlp"])}
    search = SearchProposer(knobs, seed=0)
    search.tell({"knobs": {"seqs": 4, "threads": 2}, "status": "measured", "objective": 3.0, "feasible": True})
    assert len(search.study.trials) == 1 and search.study.trials[0].params == {"seqs": 4, "threads": 2}
    assert search.close(["threads"]) == ["threads"] and search.fixed == {"threads": 1}
    assert search.close(["seqs"]) == []  # the last searched knob stays
    h = Hypothesis("decode is slow", ["decode"], ["seqs"], "local_ab", "less", key="hypothesis/0")
    proposal = search.propose(context([], {"seqs": 1, "threads": 1}, [h]))
    assert proposal.knobs["threads"] == 1 and proposal.hypothesis == "hypothesis/0"


def test_next_probes_name_probes_and_probes_have_cost_classes() -> None:
    assert probes_in(["infragent gil (is one thread starved?)", "bench CANDIDATE --vs REFERENCE",
                      "wrap the code in spans", "infragent roofline f --inputs ..."]) == ["gil", "bench", "roofline"]
    assert cost_of("check") < cost_of("bench") < cost_of("gil") == cost_of("roofline") < cost_of("local_ab") \
        < cost_of("end_to_end")


class Planted:
    """A diagnosis whose observation names two probes; only the gil one finds its cause."""

    observe = ["trace"]

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.probes = {name: self._probe(name) for name in ("trace", "gil", "roofline", "bench")}

    def _probe(self, name: str):  # noqa: ANN202
        def run() -> Feedback:
            self.ran.append(name)
            if name == "trace":
                return Feedback("analyze", "pass", "two threads never overlap",
                                next_probes=["infragent gil (starved?)", "infragent roofline (redundant work?)"])
            if name == "gil":
                return Feedback("gil", "fail", "kv-transfer waited 80% of its time",
                                next_probes=["bench the fix against the baseline"])
            return Feedback(name, "pass", f"{name}: nothing found")
        return run

    def pose(self, results: dict) -> list[Hypothesis]:
        named = probes_in([t for r in results.values() for t in r.get("next_probes", [])])
        return [Hypothesis(f"{p} finds the cause", [], [], p, "it does", locality={"question": p}) for p in named]

    def settle(self, probe: str, hypothesis: Hypothesis, results: dict) -> Hypothesis:
        record = results[f"ladder/{probe}"]
        return hypothesis.settle("supported" if record["verdict"] == "fail" else "refuted", f"ladder/{probe}",
                                 record["finding"])


def test_diagnosis_runs_the_cheapest_refuting_probe_first_and_settles_each_hypothesis(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run = ledger.start_run("optimize", "spec.toml", "x", None)
    spec = Spec.model_validate({"target": {"kind": "kernel", "candidate": "k.py:f", "reference": "k.py:g",
                                           "inputs": "k.py:i"}})
    ctx = RunContext(spec, tmp_path / "spec.toml", ledger, run, Budget(probes=10, minutes=5), lambda line: None)
    planted = Planted()
    found = diagnose(ctx, planted, ledger.experiment(run, "baseline", {}))
    assert planted.ran == ["trace", "gil", "bench", "roofline"]  # posed by next_probes, cheapest open one first
    assert {h.probe: h.status for h in found} == {"gil": "supported", "roofline": "refuted", "bench": "refuted"}
    stored = {h["key"]: h for h in ledger.hypotheses(run)}
    assert stored["hypothesis/0"]["settled_by"] == "ladder/gil" and stored["hypothesis/0"]["status"] == "supported"
    assert [r["probe"] for r in ledger.probe_results(run)] == ["analyze", "gil", "bench", "roofline"]
    chain = chains(ledger, run)[0]
    assert chain["probe_verdict"] == "fail" and chain["decision"].startswith("focus")
    # resumed: nothing runs again
    again = Planted()
    resumed = RunContext(spec, tmp_path / "spec.toml", ledger, run, Budget(probes=10, minutes=5), lambda line: None)
    assert [h.status for h in diagnose(resumed, again, 1)] == [h.status for h in found] and again.ran == []


def test_a_traced_engine_says_its_prefill_is_chunked_and_requests_wait(tmp_path: Path) -> None:
    import json

    from infragent.agent.targets.serving_target import EngineDiagnostics, ServingTarget
    from infragent.lab.spec import load_spec
    from server_fixture import TINY_HYBRID

    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(f"""
[target]
kind = "engine"
model = "hybrid"
serve_args = ["--hybrid-config", '{json.dumps(TINY_HYBRID)}', "--max-model-len", "512", "--threads", "1"]

[knobs.max_num_batched_tokens]
type = "int"
domain = [16, 256]
default = 16

[knobs.max_num_seqs]
type = "int"
domain = [1, 8]
default = 1

[[scenarios]]
name = "s"
random_input_len = 96
random_output_len = 4
""")
    knobs = {"max_num_batched_tokens": 16, "max_num_seqs": 1}
    target = ServingTarget(load_spec(spec_path), spec_path)
    target.baseline_knobs = knobs
    diagnostics = EngineDiagnostics(target.spec, knobs, target.trace_baseline)
    trace = diagnostics.probes["trace"]().to_dict()
    found = diagnostics.pose({"ladder/trace": trace})
    chunked = next(h for h in found if h.claim.startswith("prefill is cut into chunks of 16 tokens"))
    waiting = next(h for h in found if h.claim.startswith("requests wait for a slot"))
    assert chunked.knobs == ["max_num_batched_tokens"] and waiting.knobs == ["max_num_seqs"]
    scheduling = trace["details"]["scheduling"]
    assert scheduling["steps_at_budget"] >= 2 * 5 and scheduling["max_running"] == 1


def test_trials_on_cluster_nodes_are_ranked_by_their_gain_over_their_own_twin() -> None:
    ray_trials = [{"trial": 0, "status": "measured", "feasible": True, "objective": 0.94, "objective_ratio": 3.3,
                   "node": "a"},
                  {"trial": 2, "status": "measured", "feasible": True, "objective": 0.76, "objective_ratio": 3.4,
                   "node": "b"}]
    assert best_of(ray_trials)[0]["trial"] == 2  # node a was the quieter one; trial 2 gained more on its own
    local_trials = [{k: v for k, v in t.items() if k != "node"} for t in ray_trials]
    assert best_of(local_trials)[0]["trial"] == 0  # one machine: the objectives compare directly


def test_search_widens_to_the_other_knobs_once_the_suspects_knobs_are_tried_out() -> None:
    knobs = {"slots": Knob(type="choice", domain=["one", "many"], default="one", acts_on=["batch_limit"]),
             "threads": Knob(type="int", domain=[1, 2], default=1, acts_on=["threads"]),
             "batch": Knob(type="choice", domain=[64, 128], default=64)}
    search = SearchProposer(knobs, ["batch_limit"], seed=0)
    search.close(["batch"])  # a refuted direction stays closed when the search widens
    baseline = {"slots": "one", "threads": 1, "batch": 64}
    trials: list[dict] = []
    for _ in range(3):
        proposal = search.propose(context(trials, baseline))
        result = {"trial": len(trials), "knobs": proposal.knobs, "status": "measured", "objective": 1.0,
                  "feasible": True}
        trials.append(result)
        search.tell(result)
    assert trials[0]["knobs"] == {"slots": "many", "threads": 1, "batch": 64}  # the suspect's knob first
    assert {t["knobs"]["threads"] for t in trials[1:]} == {2} and "widened to threads" in proposal.rationale
    assert all(t["knobs"]["batch"] == 64 for t in trials)
    with pytest.raises(SearchDone, match="every combination"):
        search.propose(context(trials, baseline))


def playbook_moves() -> list:
    from infragent.lab.spec import Move

    return [Move(knobs={"kv": 0.4}, why="more KV cache"), Move(knobs={"threads": 2}),
            Move(knobs={"seqs": 8}, why="a larger batch")]


def test_the_playbook_runs_as_written_without_a_diagnosis_and_builds_on_the_incumbent() -> None:
    from infragent.agent.proposers.playbook import PlaybookProposer

    playbook, baseline = PlaybookProposer(playbook_moves()), {"kv": 0.1, "threads": 1, "seqs": 2}
    first = playbook.propose(context([], baseline))
    assert first.knobs == {"kv": 0.4, "threads": 1, "seqs": 2} and first.hypothesis is None
    assert first.rationale.startswith("playbook move 1: kv = 0.4 (more KV cache)")
    trials = [{"trial": 0, "knobs": first.knobs, "status": "measured", "objective": 5.0, "feasible": True}]
    second = playbook.propose(context(trials, baseline))
    assert second.knobs == {"kv": 0.4, "threads": 2, "seqs": 2}  # on top of the accepted move
    trials.append({"trial": 1, "knobs": second.knobs, "status": "measured", "objective": 4.0, "feasible": False})
    assert playbook.propose(context(trials, baseline)).knobs == {"kv": 0.4, "threads": 1, "seqs": 8}
    trials.append({"trial": 2, "knobs": {"kv": 0.4, "threads": 1, "seqs": 8}, "status": "rejected",
                   "objective": None, "feasible": False})
    with pytest.raises(SearchDone, match="every playbook move"):
        playbook.propose(context(trials, baseline))


def test_a_diagnosis_pulls_its_moves_forward_and_a_refuted_one_drops_them() -> None:
    from infragent.agent.proposers.playbook import PlaybookProposer

    playbook, baseline = PlaybookProposer(playbook_moves()), {"kv": 0.1, "threads": 1, "seqs": 2}
    queued = Hypothesis("requests wait for a slot", ["batch_limit"], ["seqs"], "local_ab", "more", key="hypothesis/0")
    starved = Hypothesis("one thread on a core", ["threads"], ["threads"], "local_ab", "more", key="hypothesis/1",
                         status="supported")
    assert [(i, h.key if h else None) for i, h in playbook.order([queued, starved])] == \
        [(1, "hypothesis/1"), (2, "hypothesis/0"), (0, None)]  # supported before open, then the rest as written
    proposal = playbook.propose(context([], baseline, [queued]))
    assert proposal.knobs["seqs"] == 8 and proposal.hypothesis == "hypothesis/0"
    assert "it acts on hypothesis/0 (open)" in proposal.rationale
    queued.status = "refuted"
    assert playbook.propose(context([], baseline, [queued])).knobs == {"kv": 0.4, "threads": 1, "seqs": 2}
    trials = [{"trial": 0, "knobs": {"kv": 0.4, "threads": 1, "seqs": 2}, "status": "measured", "objective": 1.0,
               "feasible": False}, {"trial": 1, "knobs": {"kv": 0.1, "threads": 2, "seqs": 2}, "status": "measured",
                                    "objective": 1.0, "feasible": False}]
    with pytest.raises(SearchDone):  # the batch move acts only on a refuted hypothesis
        playbook.propose(context(trials, baseline, [queued]))


def test_a_playbook_move_must_name_a_declared_knob_and_a_value_in_its_domain(tmp_path: Path) -> None:
    from infragent.agent.proposal import ProposalError
    from infragent.agent.proposers.playbook import PlaybookProposer
    from infragent.lab.spec import SpecError, load_spec

    head = ('[target]\nkind = "command"\ncommand = "server --port {port} --seqs {seqs}"\n'
            'base_url = "http://127.0.0.1:{port}"\nready_url = "http://127.0.0.1:{port}/health"\n\n'
            '[knobs.seqs]\ntype = "int"\ndomain = [1, 16]\ndefault = 2\n\n'
            '[[scenarios]]\nname = "chat"\n\n')
    for move, said in [("knobs = { sqes = 8 }", "'sqes' is not a declared knob; known: seqs"),
                       ("knobs = { seqs = 32 }", "seqs = 32 is outside [1, 16]"),
                       ('knobs = { seqs = "8" }', "seqs = '8' needs an integer"),
                       ("knobs = {}", "a move sets at least one knob, e.g. knobs = { name = value }")]:
        path = tmp_path / "spec.toml"
        path.write_text(head + '[[playbook]]\nknobs = { seqs = 4 }\n\n[[playbook]]\n' + move + '\n')
        with pytest.raises(SpecError) as err:
            load_spec(path)
        assert str(err.value) == f"{path}:19: playbook.1.knobs: {said}", str(err.value)
    path.write_text(head + '[[playbook]]\nknobs = { seqs = 4 }\nwhy = "a larger batch"\n')
    assert load_spec(path).playbook[0].knobs == {"seqs": 4}
    with pytest.raises(ProposalError, match=r"no \[\[playbook\]\] moves"):
        PlaybookProposer([])


def test_the_limit_says_whether_measured_proposals_failed_or_were_left_inconclusive() -> None:
    trials = [{"trial": 0, "status": "measured", "feasible": False, "objective": 14.0,
               "judgements": [{"verdict": "pass"}, {"verdict": "inconclusive"}]},
              {"trial": 1, "status": "measured", "feasible": False, "objective": 9.0,
               "judgements": [{"verdict": "fail"}]}]
    best, limits = best_of(trials)
    assert best is None
    assert limits == ["no measured proposal passed every criterion (1 failed one, 1 left one inconclusive)"]
