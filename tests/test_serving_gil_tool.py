"""The gil probe on an engine worktree (the LLM proposer's `gil` tool for engine targets) runs the worktree's
own engine code in its child, and answers per thread."""
from __future__ import annotations

import json
from pathlib import Path

from engine_checkout import planted_checkout
from infragent.engine.config import EngineConfig
from infragent.probes.gil import run_gil

WORKLOAD = "infragent.probes.step_worker:gil_workload"
UNIT = {"config": json.loads(EngineConfig(model="llama", max_model_len=256, max_num_seqs=2).to_json()),
        "prompts": [[1, 504, 3458, 282], [1, 563, 14881]], "max_tokens": 4, "units": 2}


def test_the_gil_probe_runs_the_worktrees_engine(tmp_path: Path) -> None:
    checkout = planted_checkout(tmp_path / "checkout")
    env = {"INFRAGENT_STEP_UNIT": json.dumps(UNIT)}
    answer = run_gil(WORKLOAD, code=checkout, env=env)
    assert answer.verdict in ("pass", "fail", "inconclusive") and "failed in the child" not in answer.finding
    assert any(row["thread"] == "MainThread" for row in answer.details["threads"]), answer.details
    worker = checkout / "src" / "infragent" / "probes" / "step_worker.py"
    worker.write_text(worker.read_text().replace('    unit = json.loads(os.environ["INFRAGENT_STEP_UNIT"])',
                                                 '    raise RuntimeError("the worktree copy ran")'))
    marked = run_gil(WORKLOAD, code=checkout, env=env)
    assert marked.verdict == "inconclusive" and "the worktree copy ran" in marked.finding
