"""The command proposer: any outside program (a script, another agent) proposes a patch.

The program runs in the workspace's source folder with the JSON context on stdin (plus `workspace` and
`root`, the worktree's top and source folder). It either prints a unified diff, prints a JSON object
`{"patch": ..., "rationale": ..., "hypothesis": "hypothesis/N"}`, or edits the files in place (then the
worktree's diff is the patch). A proposal that names no hypothesis tests none.
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from infragent.agent.proposal import Proposal, ProposalContext, ProposalError, truncate
from infragent.agent.workspace import WorkspaceError


class CommandProposer:
    """Runs an outside program that proposes one patch per call."""

    name = "command"
    edits_code = True

    def __init__(self, command: str | list[str], timeout_s: float = 600, memory_gb: float | None = None) -> None:
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise ProposalError("the proposer command is empty: give the program to run, e.g. 'python propose.py'")
        self.command = shlex.join(self.argv)
        self.timeout_s = timeout_s
        self.memory_gb = memory_gb  # None by default: agents on Node or Go reserve far more address space than they use

    def propose(self, context: ProposalContext) -> Proposal:
        """Run the command once in the workspace; its patch, applied there."""
        workspace = context.workspace
        assert workspace is not None
        payload = {**context.info, "workspace": str(workspace.path), "root": str(workspace.root)}
        env = {"INFRAGENT_WORKSPACE": str(workspace.path), "INFRAGENT_ROOT": str(workspace.root)}
        try:
            done = workspace.run(self.argv, self.timeout_s, self.memory_gb, env=env, cwd=workspace.root,
                                 stdin=json.dumps(payload, default=str))
        except WorkspaceError as e:
            raise ProposalError(f"proposer command `{self.command}`: {e}") from e
        transcript = [{"role": "command", "argv": done.argv, "rc": done.rc, "seconds": round(done.seconds, 3),
                       "timed_out": done.timed_out, "stdout": truncate(done.stdout), "stderr": truncate(done.stderr)}]
        stderr = truncate(done.stderr.strip(), 2000) or "(empty)"
        if done.timed_out:
            raise ProposalError(f"proposer command `{self.command}` timed out after {self.timeout_s:g} s and was "
                                f"killed (rc {done.rc}); stderr: {stderr}", transcript)
        if done.rc != 0:
            raise ProposalError(f"proposer command `{self.command}` failed with rc {done.rc}; stderr: {stderr}",
                                transcript)
        printed, rationale, hypothesis = _read_output(done.stdout)
        if printed:
            if workspace.diff():
                raise ProposalError(f"proposer command `{self.command}` both edited files and printed a patch: "
                                    "do one or the other", transcript)
            try:
                workspace.apply(printed)
            except WorkspaceError as e:
                raise ProposalError(f"the patch printed by `{self.command}` (rc {done.rc}) does not apply: {e}; "
                                    f"stderr: {stderr}", transcript) from e
        patch = workspace.diff()
        if not patch:
            raise ProposalError(f"proposer command `{self.command}` (rc {done.rc}) changed nothing: print a unified "
                                f"diff or a JSON object with 'patch', or edit files under {workspace.root}; "
                                f"stderr: {stderr}", transcript)
        return Proposal(patch, rationale or f"patch from `{self.command}`", self.name, transcript, done.seconds,
                        hypothesis=hypothesis)  # none named: it tests none

    def tell(self, result: dict[str, Any]) -> None:
        """Nothing to learn: the next call's context lists every earlier trial."""


def _read_output(stdout: str) -> tuple[str, str, str | None]:
    """(patch, rationale, hypothesis key) from a program's stdout: a JSON object, a unified diff (after any
    chatter), or neither."""
    text = stdout.strip()
    if text.startswith("{"):
        try:
            reply = json.loads(text)
        except json.JSONDecodeError:
            reply = None
        if isinstance(reply, dict):
            return (str(reply.get("patch") or ""), str(reply.get("rationale") or ""),
                    str(reply["hypothesis"]) if reply.get("hypothesis") else None)
    lines = stdout.splitlines(keepends=True)
    for i, line in enumerate(lines):
        is_header = line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        if line.startswith("diff --git ") or is_header:
            return "".join(lines[i:]), "", None
    return "", "", None
