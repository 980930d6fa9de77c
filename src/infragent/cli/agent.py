"""The agent's commands: optimize a target within a spec's criteria, and serve the tools over MCP."""
from __future__ import annotations

from typing import Optional

import typer

from infragent.cli.common import DEFAULT_LEDGER, app, fail, ledger_file

@app.command()
def optimize(
    spec: Optional[str] = typer.Argument(None, help="A spec TOML or a scenario-pack folder (default: the engine-slo pack)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the spec and print the plan; run nothing."),
    proposer: str = typer.Option("search", "--proposer", help="search (Optuna over the suspect knobs), playbook "
                                 "(the spec's [[playbook]] moves, the diagnosed ones first), llm (an "
                                 "OpenAI-compatible model with tools) or command (an external program: JSON on stdin, "
                                 "a patch out); llm and command patch the target's code (kernel folders, or [target] code = PATH) in a "
                                 "git worktree, never the user's tree."),
    command: Optional[str] = typer.Option(None, "--command", help="The program for --proposer command."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", help="Default: $INFRAGENT_LLM_BASE_URL or "
                                               "$OPENAI_BASE_URL."),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="Default: $INFRAGENT_LLM_MODEL or $OPENAI_MODEL."),
    budget_probes: int = typer.Option(12, "--budget-probes", help="Stop after this many probe runs."),
    budget_minutes: float = typer.Option(8.0, "--budget-minutes", help="Stop starting trials after this long."),
    budget_trials: Optional[int] = typer.Option(None, "--budget-trials", min=1, help="Start at most this many trials."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue an interrupted run."),
    ledger_path: str = typer.Option(DEFAULT_LEDGER, "--ledger", help="The ledger: a SQLite file, or "
                                    "postgresql://... ($INFRAGENT_LEDGER)."),
    feedback: str = typer.Option("ladder", "--feedback", help="ladder (default: diagnosis, then each proposal "
                                 "through the cheapest probes first) or e2e-only (every proposal judged end to end "
                                 "only: the ablation of the ladder)."),
    executor: Optional[str] = typer.Option(None, "--executor", help="local (trials one after another, here) or ray "
                                           "(trials concurrently on a Ray cluster, each with its own twin baseline "
                                           "on its node; pip install 'infragent[ray]'). Default: the spec's "
                                           "[executor], else local."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="The Ray cluster to use (\"auto\", "
                                              "ray://HOST:10001); default: the spec's, else a local one started "
                                              "for the run."),
) -> None:
    """Optimize a target within a spec's criteria: trace, hypotheses, proposals through check, local A/B,
    end-to-end and criteria; everything in the ledger; a summary and an HTML report at the end."""
    from infragent.agent.context import FEEDBACK_MODES, Budget
    from infragent.agent.run_optimize import run_optimize
    from infragent.lab.spec import SpecError, load_spec, plan, resolve_spec

    try:
        path = resolve_spec(spec)
        parsed = load_spec(path)
    except SpecError as err:
        fail(str(err))
        return
    chosen = _executor(parsed.executor, executor, ray_address)
    for line in plan(parsed):
        typer.echo(line)
    if chosen.kind == "ray":
        typer.echo(f"executor: ray ({chosen.address or 'a local cluster started for the run'}); each trial holds "
                   f"{parsed.target.resources.ray_demand()} on one node, with its own twin baseline there")
    if feedback not in FEEDBACK_MODES:
        fail(f"--feedback {feedback}: choose one of {', '.join(FEEDBACK_MODES)}")
    if dry_run:
        return
    try:
        chosen_proposer = _proposer(proposer, parsed, command, llm_base_url, llm_model)
        run_optimize(path, ledger_file(ledger_path, export_artifacts=True),
                     Budget(budget_probes, budget_minutes, budget_trials),
                     resume, chosen_proposer, feedback, chosen)
    except (ValueError, RuntimeError) as err:
        fail(str(err))


def _executor(spec_executor, kind: Optional[str], address: Optional[str]):  # noqa: ANN001, ANN202
    """The spec's [executor] with the flags over it; an unknown kind or a stray address fails with the flag."""
    from infragent.lab.spec import Executor

    if kind is not None and kind not in ("local", "ray"):
        fail(f"--executor {kind}: choose local or ray")
    chosen = Executor(kind=kind or spec_executor.kind, address=address or spec_executor.address)
    if chosen.kind == "local" and address:
        fail("--ray-address: only with --executor ray (or kind = \"ray\" in the spec's [executor])")
    return chosen


def _proposer(name: str, spec, command: Optional[str], base_url: Optional[str],  # noqa: ANN001, ANN202
              model: Optional[str]):
    """None for search; the playbook, llm or command proposer otherwise (errors name the missing flag, variable
    or spec table)."""
    if name == "search":
        return None
    if name == "playbook":
        from infragent.agent.proposers.playbook import PlaybookProposer

        return PlaybookProposer(spec.playbook)
    if name == "command":
        from infragent.agent.proposers.command import CommandProposer

        if not command:
            raise ValueError("--proposer command needs --command 'PROGRAM ARGS' (it gets JSON on stdin, returns a patch)")
        return CommandProposer(command)
    if name == "llm":
        from infragent.agent.proposers.llm import LLMProposer

        return LLMProposer(base_url=base_url, model=model)
    raise ValueError(f"--proposer {name}: choose search, playbook, llm or command")


@app.command()
def mcp(
    root: str = typer.Option(".", "--root", help="Workspace root: every path a tool takes must stay inside it."),
    tracebacks: bool = typer.Option(False, "--tracebacks", help="Add the traceback to a failed call's answer."),
) -> None:
    """Serve the probes, analyses, ledger queries and criteria evaluation as MCP tools over stdio."""
    import os

    from infragent.agent.mcp.server import build_server

    os.chdir(root)  # module:function names and the artifacts folder are the root's, wherever it was started
    build_server(".", tracebacks).run()
