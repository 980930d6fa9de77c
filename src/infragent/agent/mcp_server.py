"""`infragent mcp`: the probes, the analyses, ledger queries and criteria evaluation as MCP tools over stdio
(the official `mcp` SDK), so any MCP client (a coding agent) can drive them.

Every path a tool takes is resolved inside the workspace root; one that leads outside (`..`, an absolute
path elsewhere, a symlink out) is rejected with a clear error. Callables given as `file.py:function`
must live inside the root too. Tools return the probe's Feedback as JSON text.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


class OutsideRoot(ToolError):
    """A path that resolves outside the workspace root."""


def _clear(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input (a bad path, trace, spec or callable) reaches the client as a tool error with its message."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except (ValueError, LookupError, OSError, ImportError) as err:
            raise ToolError(f"{type(err).__name__}: {err}") from err

    return wrapper


def build_server(root: str | Path) -> MCPServer:
    """The MCP server with every tool confined to root."""
    root = Path(root).resolve()
    server = MCPServer(name="infragent", instructions=(
        "Performance probes for LLM inference. Each tool returns a Feedback: verdict, finding, numbers with "
        f"confidence intervals, locality and evidence. Paths are relative to the workspace root {root}."))

    def inside(path: str) -> Path:
        resolved = (root / path).resolve()
        if not resolved.is_relative_to(root):
            raise OutsideRoot(f"{path}: resolves to {resolved}, outside the workspace root {root}; "
                              "give a path inside it")
        return resolved

    def callable_inside(name: str) -> str:
        module, _, _ = name.partition(":")
        if module.endswith(".py"):
            return f"{inside(module)}:{name.partition(':')[2]}"
        return name

    @server.tool()
    @_clear
    def analyze_trace(trace: str, baseline: str | None = None, overlap_a: str | None = None,
                      overlap_b: str | None = None) -> str:
        """Attribute a trace (breakdown, overlap, idle, critical path); with baseline, the diff."""
        from infragent.probes.analyze import analyze

        pairs = [(overlap_a, overlap_b)] if overlap_a and overlap_b else []
        return analyze(inside(trace), inside(baseline) if baseline else None, pairs).to_json()

    @server.tool()
    @_clear
    def check(candidate: str, reference: str, inputs: str, partition: str | None = None, trials: int = 12) -> str:
        """Compare candidate with reference (module:function or file.py:function) on fresh random inputs."""
        from infragent.probes.callables import resolve
        from infragent.probes.check import run_check

        cand, ref, factory = (resolve(callable_inside(n), w) for n, w in
                              ((candidate, "candidate"), (reference, "reference"), (inputs, "inputs")))
        return run_check(cand, ref, factory, partition=partition, trials=trials).to_json()

    @server.tool()
    @_clear
    def bench(fn: str, vs: str | None = None, inputs: str | None = None, budget_s: float = 2.0) -> str:
        """Time fn (A/B against vs): interleaved pairs, bootstrap CI of the median ratio."""
        from infragent.probes.bench import run_bench
        from infragent.probes.callables import resolve

        a = resolve(callable_inside(fn), "function")
        b = resolve(callable_inside(vs), "vs") if vs else None
        factory = resolve(callable_inside(inputs), "inputs") if inputs else None
        return run_bench(a, b, factory, budget_s=budget_s, names=(fn, vs)).to_json()

    @server.tool()
    @_clear
    def roofline(fn: str, inputs: str) -> str:
        """FLOPs and bytes against the machine's peaks: compute-, memory- or overhead-bound."""
        from infragent.probes.callables import resolve
        from infragent.probes.roofline import run_roofline

        return run_roofline(resolve(callable_inside(fn), "function"),
                            resolve(callable_inside(inputs), "inputs")).to_json()

    @server.tool()
    @_clear
    def validate_spec(spec: str) -> str:
        """Validate a spec TOML and return the plan an optimize run would follow."""
        from infragent.lab.spec import load_spec, plan

        return "\n".join(plan(load_spec(inside(spec))))

    @server.tool()
    @_clear
    def list_runs(ledger: str = ".infragent/ledger.sqlite") -> str:
        """The ledger's runs (id, kind, spec, status, started)."""
        from infragent.lab.ledger import Ledger

        return json.dumps(Ledger(inside(ledger)).runs(), default=str)

    @server.tool()
    @_clear
    def show_run(run_id: int, ledger: str = ".infragent/ledger.sqlite") -> str:
        """Every probe result of a run, in order (key, verdict, finding)."""
        from infragent.lab.ledger import Ledger

        rows = Ledger(inside(ledger)).probe_results(run_id)
        return json.dumps([{k: r[k] for k in ("key", "probe", "verdict", "finding")} for r in rows])

    @server.tool()
    @_clear
    def evaluate_criteria(spec: str, run_id: int, ledger: str = ".infragent/ledger.sqlite") -> str:
        """Judge a spec's absolute criteria on a measure run's recorded loadgen repeats."""
        from infragent.lab.criteria import judge
        from infragent.lab.ledger import Ledger
        from infragent.lab.measure import recorded_runs
        from infragent.lab.spec import load_spec

        parsed, book = load_spec(inside(spec)), Ledger(inside(ledger))
        out = []
        for criterion in parsed.criteria:
            if criterion.max_regression is not None:
                continue
            scenario = next(s for s in parsed.scenarios if s.name == criterion.scenario)
            runs = recorded_runs(book, run_id, scenario)
            out += [j.__dict__ for j in judge(criterion, runs, bounds=tuple(scenario.buckets))]
        return json.dumps(out, default=str)

    return server
