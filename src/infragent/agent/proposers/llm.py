"""The LLM proposer: a model on any OpenAI-compatible server edits the workspace through a few tools.

A linear loop: send the messages, run each tool call the model made, append its (truncated) output, repeat
until the model calls `finish` or answers without a tool call. Tool failures are told to the model as
`error: ...` text, never raised. Every path a tool takes is relative to the worktree's top and confined to it.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from infragent.agent.proposal import Probe, Proposal, ProposalContext, ProposalError, truncate
from infragent.agent.workspace import Workspace, WorkspaceError

SYSTEM_PROMPT = """\
You improve the performance of code under optimization. The user message is a JSON context: the hypothesis \
about where time goes, the evidence behind it, and `root`, the folder holding the code (paths in your tools \
are relative to the top of a private git worktree; `root_relative` is that folder's path in it).

Make ONE focused change under the root folder that addresses the stated hypothesis. Keep every output \
correct: the same results, within the stated tolerances. Read before you edit, edit with exact text, and run \
the tests.{probes} When the change is done, call `finish` with a short rationale (what you changed and why it \
should be faster) and the key of the hypothesis it tests, if it tests one. If you make no change, call `finish` \
with the reason."""
PROBES_LINE = " run_probe runs one of the loop's probes on your worktree as it stands ({names}); each run is \
charged to the run's probe budget, so use them to refute a change before you finish, not to explore."

_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules", ".venv"}
_MAX_LISTED = 400
_MAX_MATCHES = 200
_MAX_SEARCHED_BYTES = 2_000_000


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_PATH = {"type": "string", "description": "path relative to the worktree top"}
TOOLS = [
    _tool("list_files", "List the files under a folder (recursively).", {"path": {**_PATH, "default": "."}}, []),
    _tool("read_file", "Read a text file with numbered lines; optionally a line range (1-based, inclusive).",
          {"path": _PATH, "start_line": {"type": "integer", "default": 1},
           "end_line": {"type": ["integer", "null"], "default": None}}, ["path"]),
    _tool("search", "Search text files for a Python regular expression; rows of `file:line: text`.",
          {"pattern": {"type": "string"}, "path": {**_PATH, "default": "."}}, ["pattern"]),
    _tool("edit_file", "Replace the exact text `old` (it must occur exactly once) by `new` in a file.",
          {"path": _PATH, "old": {"type": "string"}, "new": {"type": "string"}}, ["path", "old", "new"]),
    _tool("write_file", "Create or overwrite a file with `content`.",
          {"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
    _tool("run_tests", "With no args: the spec's own test command (else the tests under the root folder). With "
          "args: `python -m pytest -q -x <args>` from the worktree top.",
          {"args": {"type": "array", "items": {"type": "string"}, "default": []}}, []),
    _tool("finish", "Declare the change done (or explain why you make none: the explanation is kept for the next "
          "proposal).", {"rationale": {"type": "string"},
                         "hypothesis": {"type": ["string", "null"], "default": None,
                                        "description": "the key of the hypothesis this change tests (from the "
                                                       "context's hypotheses), or null for none"}}, ["rationale"]),
]


def tools_for(probes: dict[str, Probe]) -> list[dict[str, Any]]:
    """The tools the model gets: the file tools, run_probe naming exactly the probes it may run, finish."""
    if not probes:
        return TOOLS
    run_probe = _tool("run_probe", "Run one of the loop's probes on the worktree as it stands; its verdict as text. "
                      "Probes: " + "; ".join(f"{n}: {(p.__doc__ or '').strip().splitlines()[0] if p.__doc__ else n}"
                                            for n, p in sorted(probes.items())),
                      {"name": {"type": "string", "enum": sorted(probes)},
                       "arguments": {"type": "object", "default": {}}}, ["name"])
    return TOOLS[:-1] + [run_probe, TOOLS[-1]]


class LLMProposer:
    """Asks a model, through tool calls, for one focused change in the workspace."""

    name = "llm"
    edits_code = True

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 max_turns: int = 20, tool_output_limit: int = 4000, test_timeout_s: float = 300) -> None:
        self.base_url = base_url or _env("INFRAGENT_LLM_BASE_URL", "OPENAI_BASE_URL")
        self.model = model or _env("INFRAGENT_LLM_MODEL", "OPENAI_MODEL")
        if not self.base_url:
            raise ProposalError("no LLM server: set INFRAGENT_LLM_BASE_URL (or OPENAI_BASE_URL) to an "
                                "OpenAI-compatible endpoint such as http://localhost:8000/v1, or pass base_url")
        if not self.model:
            raise ProposalError("no LLM model: set INFRAGENT_LLM_MODEL (or OPENAI_MODEL) to the model's name on "
                                f"{self.base_url}, or pass model")
        self.api_key = api_key or _env("INFRAGENT_LLM_API_KEY", "OPENAI_API_KEY") or "none"
        self.max_turns = max_turns
        self.tool_output_limit = tool_output_limit
        self.test_timeout_s = test_timeout_s

    def propose(self, context: ProposalContext) -> Proposal:
        """Let the model edit the workspace until it calls finish; the resulting diff."""
        from openai import APIError, OpenAI

        workspace = context.workspace
        assert workspace is not None
        started = time.perf_counter()
        client = OpenAI(base_url=self.base_url, api_key=self.api_key)
        tests = (context.info.get("target") or {}).get("tests") if isinstance(context.info, dict) else None
        tools = _Tools(workspace, context.probes, self.test_timeout_s, tests)
        tools.read_limit = max(self.tool_output_limit - 200, 500)
        root_relative = workspace.root.relative_to(workspace.path).as_posix()
        payload = {**context.info, "root": str(workspace.root), "root_relative": root_relative}
        names = ", ".join(sorted(context.probes))
        prompt = SYSTEM_PROMPT.format(probes=PROBES_LINE.format(names=names) if names else "")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompt},
            {"role": "user", "content": json.dumps(payload, indent=2, default=str)}]
        rationale = None
        for _ in range(self.max_turns):
            try:
                response = client.chat.completions.create(model=self.model, messages=messages, tools=tools_for(context.probes),
                                                          tool_choice="auto")
            except APIError as e:
                raise ProposalError(f"the LLM server at {self.base_url} (model {self.model}) failed: {e}",
                                    messages) from e
            message = response.choices[0].message
            calls = message.tool_calls or []
            turn: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if calls:
                turn["tool_calls"] = [{"id": c.id, "type": "function",
                                       "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                      for c in calls]
            messages.append(turn)
            if not calls:
                rationale = message.content or ""
                break
            for call in calls:
                output, finished = tools.call(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": truncate(output, self.tool_output_limit)})
                if finished is not None:
                    rationale = finished
            if rationale is not None:
                break
        else:
            raise ProposalError(f"the model made no finish within {self.max_turns} turns: raise max_turns or "
                                "narrow the hypothesis", messages)
        patch = workspace.diff()
        if not patch:  # the model's reason is what the next proposal needs to hear
            said = rationale.strip()[:600] or "(no reason given)"
            raise ProposalError(f"the model made no change, because: {said}", messages)
        known = {h.key for h in context.hypotheses}
        return Proposal(patch, rationale.strip() or "(no rationale given)", self.name, messages,
                        time.perf_counter() - started,
                        hypothesis=tools.hypothesis if tools.hypothesis in known else None)

    def tell(self, result: dict[str, Any]) -> None:
        """Nothing to learn: the next call's context lists every earlier trial."""


class _Tools:
    """The tools the model calls, confined to one workspace."""

    def __init__(self, workspace: Workspace, probes: dict[str, Probe], test_timeout_s: float,
                 tests: str | None = None) -> None:
        self.workspace = workspace
        self.probes = probes
        self.test_timeout_s = test_timeout_s
        self.tests = tests  # the spec's test command: what run_tests runs with no args
        self.hypothesis: str | None = None  # the hypothesis key named at finish
        self.read_limit = 3800  # read_file's output, under the tool-output limit that would cut it

    def call(self, name: str, arguments: str) -> tuple[str, str | None]:
        """(output, rationale when this was `finish`); every failure comes back as `error: ...` text."""
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return f"error: the arguments of {name} are not valid JSON ({e}); send a JSON object", None
        if not isinstance(parsed, dict):
            return f"error: the arguments of {name} must be a JSON object", None
        if name == "finish":
            named = parsed.get("hypothesis")
            self.hypothesis = str(named) if named else None
            return "finished", str(parsed.get("rationale", ""))
        method = getattr(self, f"tool_{name}", None)
        if method is None:
            names = ", ".join([t["function"]["name"] for t in TOOLS] + (["run_probe"] if self.probes else []))
            return f"error: no tool named {name!r}; the tools are {names}", None
        try:
            return method(**parsed), None
        except TypeError as e:
            return f"error: wrong arguments for {name}: {e}", None
        except (WorkspaceError, OSError, ValueError, re.error) as e:
            return f"error: {e}", None

    def tool_list_files(self, path: str = ".") -> str:
        folder = self.workspace.resolve(path)
        if not folder.is_dir():
            raise ValueError(f"{path} is not a folder")
        top = self.workspace.path.resolve()
        rows = []
        for current, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            rows += [(Path(current) / f).relative_to(top).as_posix() for f in sorted(files)]
            if len(rows) > _MAX_LISTED:
                return "\n".join(rows[:_MAX_LISTED]) + "\n[... more files: list a subfolder to see them ...]"
        return "\n".join(rows) or "(no files)"

    def tool_read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        lines = self._text(path).splitlines()
        first = max(int(start_line), 1)
        last = len(lines) if end_line is None else min(int(end_line), len(lines))
        if first > len(lines):
            return f"{path} has {len(lines)} lines; start_line {first} is past the end"
        shown, size = [], 0
        for n in range(first, last + 1):  # whole lines up to the output limit, never a cut in the middle
            row = f"{n:>6}  {lines[n - 1]}"
            if shown and size + len(row) + 1 > self.read_limit:
                return "\n".join(shown) + (f"\n[lines {n}-{last} of {path} not shown (output limit): call read_file "
                                           f"with start_line={n}]")
            shown.append(row)
            size += len(row) + 1
        return "\n".join(shown)

    def tool_search(self, pattern: str, path: str = ".") -> str:
        regex = re.compile(pattern)
        start = self.workspace.resolve(path)
        top = self.workspace.path.resolve()
        files = [start] if start.is_file() else _walk_files(start)
        rows = []
        for file in files:
            if file.is_symlink() or file.stat().st_size > _MAX_SEARCHED_BYTES:
                continue
            data = file.read_bytes()
            if b"\0" in data[:8192]:
                continue  # binary
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if regex.search(line):
                    rows.append(f"{file.relative_to(top).as_posix()}:{number}: {line.strip()[:200]}")
                    if len(rows) >= _MAX_MATCHES:
                        return "\n".join(rows) + f"\n[... stopped at {_MAX_MATCHES} matches: narrow the search ...]"
        return "\n".join(rows) or f"no match for {pattern!r} under {path}"

    def tool_edit_file(self, path: str, old: str, new: str) -> str:
        if not old:
            raise ValueError("old is empty: give the exact text to replace (use write_file to create a file)")
        text = self._text(path)
        count = text.count(old)
        if count == 0:
            raise ValueError(f"old text not found in {path}: read the file and copy the text exactly, whitespace "
                             "included")
        if count > 1:
            raise ValueError(f"old text occurs {count} times in {path}: include more surrounding lines so it is unique")
        line = text[:text.index(old)].count("\n") + 1
        self.workspace.resolve(path).write_text(text.replace(old, new, 1), encoding="utf-8")
        return f"edited {path}: replaced the text at line {line} ({old.count(chr(10)) + 1} lines -> " \
               f"{new.count(chr(10)) + 1} lines)"

    def tool_write_file(self, path: str, content: str) -> str:
        target = self.workspace.resolve(path)
        if target.is_dir():
            raise ValueError(f"{path} is a folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content.encode())} bytes to {path}"

    def tool_run_tests(self, args: list[str] | None = None) -> str:
        top = self.workspace.path
        paths = [str(p) for p in (top / "src", self.workspace.root) if p.is_dir()]
        inherited = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths + ([inherited] if inherited else []))),
               "PYTHONDONTWRITEBYTECODE": "1",
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        if (args is None or args == []) and self.tests:
            shown, argv = self.tests, ["bash", "-c", self.tests]
        else:
            if args is None or args == []:
                relative = self.workspace.root.relative_to(self.workspace.path).as_posix()
                args = [] if relative == "." else [relative]
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ValueError("args must be a list of strings")
            shown = f"pytest -q -x {' '.join(args)}"
            argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]
        done = self.workspace.run(argv, self.test_timeout_s, env=env, cwd=top)
        status = f"timed out after {self.test_timeout_s:g} s" if done.timed_out else f"rc {done.rc}"
        return f"$ {shown}\n{status} in {done.seconds:.1f} s\n{done.stdout}{done.stderr}"

    def tool_run_probe(self, name: str, arguments: dict | None = None) -> str:
        if name not in self.probes:
            available = ", ".join(sorted(self.probes)) or "none in this run"
            return f"error: no probe named {name!r}; available: {available}"
        try:
            result = self.probes[name](dict(arguments or {}))
        except Exception as e:  # a probe's failure is feedback for the model, not the end of the proposal
            return f"error: probe {name} failed: {type(e).__name__}: {e}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def _text(self, path: str) -> str:
        file = self.workspace.resolve(path)
        if not file.is_file():
            raise ValueError(f"{path} is not a file: list_files shows what exists")
        return file.read_text(encoding="utf-8", errors="replace")


def _walk_files(folder: Path) -> list[Path]:
    found = []
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        found += [Path(current) / f for f in sorted(files)]
    return found


def _env(*names: str) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None
