"""The loop's view of a spec's target, by kind: kernel targets, or serving targets (engine and command)."""
from __future__ import annotations

from pathlib import Path

from infragent.agent.targets.kernel_target import KernelTarget
from infragent.agent.targets.serving_target import ServingTarget
from infragent.agent.targets import LoopTarget
from infragent.lab.spec import Spec


def make_target(spec: Spec, spec_path: Path) -> LoopTarget:
    """The loop's view of the spec's target."""
    if spec.target.kind == "kernel":
        return KernelTarget(spec, spec_path)
    return ServingTarget(spec, spec_path)
