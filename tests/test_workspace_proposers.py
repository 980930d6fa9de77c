"""Code workspaces (git worktrees, sandboxed runs) and the command and LLM proposers, on small temporary repos."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infragent.agent.proposers.command import CommandProposer
from infragent.agent.proposers.llm import LLMProposer
from infragent.agent.proposal import ProposalContext, ProposalError, truncate
from infragent.agent.workspace import Workspace, WorkspaceError
from scripted_llm import ScriptedLLM

MODULE = "def add(a, b):\n    return a + b\n\n\ndef scale(xs, k):\n    return [x * k for x in xs]\n"
TEST = "from pkg.mod import add, scale\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n" \
       "def test_scale():\n    assert scale([1, 2], 3) == [3, 6]\n"
PATCH = """\
diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -4,3 +4,4 @@ def add(a, b):
 
 def scale(xs, k):
+    # one multiply per element
     return [x * k for x in xs]
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # our own looks must not refresh the index either
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repo holding pkg/mod.py and tests/test_mod.py, one commit on main."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "mod.py").write_text(MODULE)
    (repo / "tests" / "test_mod.py").write_text(TEST)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "start")
    return repo


def snapshot(repo: Path) -> dict:
    """Everything of the user's that must not change: files, status, index, HEAD, branches."""
    files = {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*"))
             if p.is_file() and ".git" not in p.relative_to(repo).parts}
    return {"files": files, "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
            "index": hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest(),
            "head": git(repo, "rev-parse", "HEAD"), "symbolic": git(repo, "symbolic-ref", "HEAD"),
            "branches": git(repo, "branch", "-a", "--format=%(refname)")}


def test_workspace_roundtrip_leaves_the_user_tree_alone(repo: Path, tmp_path: Path) -> None:
    before = snapshot(repo)
    home = tmp_path / "home"
    ws = Workspace.create(repo / "pkg", home, "cand1")
    assert ws.path == home / "worktrees" / "cand1" and ws.root == ws.path / "pkg" and ws.repo == repo.resolve()
    assert (ws.root / "mod.py").read_text() == MODULE and ws.diff() == ""
    ws.apply(PATCH)
    assert "# one multiply per element" in (ws.root / "mod.py").read_text()
    (ws.root / "new.py").write_text("X = 1\n")
    (ws.root / "__pycache__").mkdir()
    (ws.root / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")  # run leftovers are not the candidate
    patch = ws.diff()
    assert "__pycache__" not in patch
    assert "+    # one multiply per element" in patch and "b/pkg/new.py" in patch

    with Workspace.create(repo / "pkg", home, "cand2") as other:  # the diff round-trips onto a fresh worktree
        other.apply(patch)
        assert other.diff() == patch
    assert not (home / "worktrees" / "cand2").exists()

    with pytest.raises(WorkspaceError, match="does not apply"):
        ws.apply(PATCH)  # already applied: git's message comes through
    with pytest.raises(WorkspaceError, match=r"'\.\.'"):
        ws.apply(PATCH.replace("a/pkg/mod.py", "a/../x.py"))

    out = tmp_path / "out"
    path = ws.export(out, {"hypothesis": "scale is slow"})
    assert path == out / "cand1.patch" and path.read_text() == patch
    evidence = json.loads((out / "cand1.evidence.json").read_text())
    assert evidence["hypothesis"] == "scale is slow"
    assert evidence["base_commit"] == before["head"].strip()
    assert evidence["patch_sha256"] == hashlib.sha256(patch.encode()).hexdigest()

    ws.remove()
    ws.remove()  # idempotent
    assert not ws.path.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert snapshot(repo) == before


def test_workspace_from_a_folder_outside_git(tmp_path: Path) -> None:
    source = tmp_path / "site-packages" / "pack"
    source.mkdir(parents=True)
    (source / "mod.py").write_text(MODULE)
    (source / "__pycache__").mkdir()
    (source / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0junk")
    home = tmp_path / "home"
    with Workspace.create(source, home, "a") as ws:
        assert ws.repo.parent == home / "sources" and ws.root == ws.path
        assert (ws.path / "mod.py").read_text() == MODULE and not (ws.path / "__pycache__").exists()
        (ws.path / "mod.py").write_text(MODULE.replace("a + b", "b + a"))
        assert "+    return b + a" in ws.diff()
        private = ws.repo
    with Workspace.create(source, home, "b") as again:
        assert again.repo == private  # one private copy per content
    assert sorted(p.name for p in (home / "sources").iterdir()) == [private.name]
    assert sorted(p.name for p in source.iterdir()) == ["__pycache__", "mod.py"]


def test_ignored_folder_inside_a_repo_gets_a_private_copy(repo: Path, tmp_path: Path) -> None:
    (repo / ".gitignore").write_text("venv/\n")  # like a pack installed in a virtualenv inside the repo
    pack = repo / "venv" / "pack"
    pack.mkdir(parents=True)
    (pack / "mod.py").write_text(MODULE)
    with Workspace.create(pack, tmp_path / "home", "v") as ws:
        assert ws.repo.parent == tmp_path / "home" / "sources" and (ws.root / "mod.py").read_text() == MODULE
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_dirty_source_is_carried_and_stays_dirty(repo: Path, tmp_path: Path) -> None:
    (repo / "pkg" / "mod.py").write_text(MODULE.replace("a + b", "a + b  # edited"))
    (repo / "pkg" / "extra.py").write_text("Y = 2\n")
    (repo / "tests" / "test_mod.py").write_text(TEST + "# outside the source folder\n")
    before = snapshot(repo)
    with Workspace.create(repo / "pkg", tmp_path / "home", "d") as ws:
        assert "# edited" in (ws.root / "mod.py").read_text() and (ws.root / "extra.py").exists()
        assert (ws.path / "tests" / "test_mod.py").read_text() == TEST  # only the source folder is carried
        assert ws.diff() == ""  # the candidate starts from what the user sees
        ws.apply(PATCH)
        assert "a + b  # edited" not in ws.diff()
        evidence = json.loads((Path(ws.export(tmp_path / "out", {})).with_suffix(".evidence.json")).read_text())
        assert evidence["start_commit"] != evidence["base_commit"] == before["head"].strip()
    assert snapshot(repo) == before
    assert " M pkg/mod.py" in before["status"] and "?? pkg/extra.py" in before["status"]


def test_resolve_stays_inside(repo: Path, tmp_path: Path) -> None:
    with Workspace.create(repo, tmp_path / "home", "r") as ws:
        assert ws.resolve("pkg/mod.py") == (ws.path / "pkg" / "mod.py").resolve()
        os.symlink("/etc", ws.path / "escape")
        for bad in ("../x", "/etc/passwd", "escape/passwd", "pkg/../../x", ".git/config"):
            with pytest.raises(WorkspaceError):
                ws.resolve(bad)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_run_timeout_kills_the_group_and_memory_is_capped(repo: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    program = ("import subprocess, sys, time\n"
               "child = subprocess.Popen(['sleep', '60'])\n"
               f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
               "print('started', flush=True)\n"
               "time.sleep(60)\n")
    with Workspace.create(repo, tmp_path / "home", "t") as ws:
        done = ws.run([sys.executable, "-c", program], timeout_s=1.5)
        assert done.timed_out and done.rc == -9 and "started" in done.stdout  # killed, not finished after 60 s
        child = int(pidfile.read_text())
        for _ in range(50):
            if _state(child) in ("gone", "Z"):
                break
            time.sleep(0.1)
        assert _state(child) in ("gone", "Z")

        hog = ws.run([sys.executable, "-c", "b = bytearray(2 * 1024**3); print(len(b))"], 30, memory_gb=0.5)
        assert hog.rc != 0 and not hog.timed_out and "MemoryError" in hog.stderr

        fine = ws.run([sys.executable, "-c", "import os, sys; print(os.getcwd(), sys.stdin.read())"], 30,
                      stdin="hello")
        assert fine.rc == 0 and fine.stdout.split() == [str(ws.root), "hello"]


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text("import json, sys\ncontext = json.load(sys.stdin)\n" + body)
    return [sys.executable, str(path)]


def asked(info: dict, ws: Workspace, probes: dict | None = None) -> ProposalContext:
    """A proposer's context for one worktree: the JSON info, no hypotheses or trials yet."""
    return ProposalContext(info, [], [], {}, ws, probes or {})


def test_command_proposer(repo: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    printer = _script(tmp_path, "printer.py",
                      "assert context['hypothesis'] == 'h' and context['root'].endswith('pkg')\n"
                      f"sys.stdout.write({PATCH!r})\n")
    with Workspace.create(repo / "pkg", home, "c1") as ws:
        proposal = CommandProposer(printer).propose(asked({"hypothesis": "h"}, ws))
        assert proposal.proposer == "command" and "+    # one multiply per element" in proposal.patch
        assert proposal.transcript[0]["rc"] == 0 and proposal.cost_s > 0

    editor = _script(tmp_path, "editor.py",
                     "import pathlib\n"
                     "p = pathlib.Path(context['root']) / 'mod.py'\n"
                     "p.write_text(p.read_text().replace('a + b', 'b + a'))\n"
                     "print(json.dumps({'rationale': 'commute'}))\n")
    with Workspace.create(repo / "pkg", home, "c2") as ws:
        proposal = CommandProposer(" ".join(editor)).propose(asked({}, ws))
        assert proposal.rationale == "commute" and "+    return b + a" in proposal.patch

    failing = _script(tmp_path, "failing.py", "sys.stderr.write('x' * 5000 + 'the real reason')\nsys.exit(1)\n")
    with Workspace.create(repo / "pkg", home, "c3") as ws:
        with pytest.raises(ProposalError, match=r"(?s)rc 1.*characters cut.*the real reason") as error:
            CommandProposer(failing).propose(asked({}, ws))
        assert "failing.py" in str(error.value)
        idle = _script(tmp_path, "idle.py", "print('nothing to do')\n")
        with pytest.raises(ProposalError, match="changed nothing"):
            CommandProposer(idle).propose(asked({}, ws))
    assert git(repo, "status", "--porcelain") == ""


def test_llm_proposer_against_a_scripted_server(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "home" / "worktrees" / "outside.py"  # what '../outside.py' would reach
    outside.parent.mkdir(parents=True)
    outside.write_text("untouched\n")
    calls: list[dict] = []

    def bench(arguments: dict) -> str:
        calls.append(arguments)
        return "speedup 1.3x " + "y" * 2000

    script = [
        [{"name": "read_file", "arguments": {"path": "pkg/mod.py"}}],
        [{"name": "edit_file", "arguments": {"path": "pkg/mod.py", "old": "return [x * k for x in xs]",
                                             "new": "return [k * x for x in xs]"}},
         {"name": "edit_file", "arguments": {"path": "../outside.py", "old": "untouched", "new": "owned"}},
         {"name": "edit_file", "arguments": {"path": "pkg/mod.py", "old": "return", "new": "yield"}}],
        [{"name": "run_tests", "arguments": {"args": ["tests"]}},
         {"name": "run_probe", "arguments": {"name": "bench", "arguments": {"repeats": 3}}},
         {"name": "run_probe", "arguments": {"name": "nope", "arguments": {}}}],
        [{"name": "finish", "arguments": {"rationale": "k first"}}],
    ]
    with ScriptedLLM(script) as llm, Workspace.create(repo / "pkg", tmp_path / "home", "l") as ws:
        proposer = LLMProposer(base_url=llm.base_url, model="m", api_key="", tool_output_limit=500)
        proposal = proposer.propose(asked({"hypothesis": "scale is slow"}, ws, {"bench": bench}))
        requests = llm.requests
    assert proposal.proposer == "llm" and proposal.rationale == "k first"
    assert "+    return [k * x for x in xs]" in proposal.patch and "outside" not in proposal.patch
    assert outside.read_text() == "untouched\n" and calls == [{"repeats": 3}]
    assert len(requests) == 4 and requests[0]["tool_choice"] == "auto"
    assert {t["function"]["name"] for t in requests[0]["tools"]} >= {"read_file", "edit_file", "run_tests", "run_probe",
                                                                     "finish"}
    assert "run_probe runs one of the loop's probes on your worktree as it stands (bench)" in \
        requests[0]["messages"][0]["content"]
    assert "scale is slow" in requests[0]["messages"][1]["content"]

    tool_results = [m["content"] for m in requests[-1]["messages"] if m["role"] == "tool"]
    read, edited, escaped, ambiguous, tests, bench_out, unknown = tool_results
    assert "     5  def scale(xs, k):" in read
    assert edited.startswith("edited pkg/mod.py") and escaped.startswith("error:") and "'..'" in escaped
    assert ambiguous.startswith("error:") and "2 times" in ambiguous
    assert "2 passed" in tests and "rc 0" in tests
    assert bench_out.startswith("speedup 1.3x") and "characters cut: showing the first 250 and last 250" in bench_out
    assert unknown.startswith("error:") and "bench" in unknown

    roles = [m["role"] for m in proposal.transcript]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "tool", "tool",
                     "assistant", "tool", "tool", "tool", "assistant", "tool"]
    assert proposal.transcript[2]["tool_calls"][0]["function"]["name"] == "read_file"
    json.dumps(proposal.transcript)  # the ledger stores it as is


def test_llm_proposer_failures(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INFRAGENT_LLM_BASE_URL", "OPENAI_BASE_URL", "INFRAGENT_LLM_MODEL", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProposalError, match="INFRAGENT_LLM_BASE_URL.*OPENAI_BASE_URL"):
        LLMProposer()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ProposalError, match="INFRAGENT_LLM_MODEL.*OPENAI_MODEL"):
        LLMProposer()

    looping = [[{"name": "list_files", "arguments": {}}]] * 3
    idle = [[{"name": "finish", "arguments": {"rationale": "nothing"}}]]
    with Workspace.create(repo, tmp_path / "home", "f") as ws:
        with ScriptedLLM(looping) as llm:
            with pytest.raises(ProposalError, match="no finish within 3 turns") as error:
                LLMProposer(llm.base_url, "m", max_turns=3).propose(asked({}, ws))
            assert "pkg/mod.py" in error.value.transcript[3]["content"]
        with ScriptedLLM(idle) as llm:
            with pytest.raises(ProposalError, match="made no change, because: nothing"):
                LLMProposer(llm.base_url, "m").propose(asked({}, ws))


def test_llm_proposer_names_the_hypothesis_it_was_told_reads_whole_lines_and_runs_the_specs_tests(
        repo: Path, tmp_path: Path) -> None:
    from infragent.agent.hypotheses import Hypothesis

    (repo / "pkg" / "long.py").write_text("".join(f"value_{n} = {n}  # a line of some length\n" for n in range(1, 400)))
    hypotheses = [Hypothesis("add is slow", ["add"], [], "bench", "less", key="hypothesis/0"),
                  Hypothesis("scale is slow", ["scale"], [], "bench", "less", key="hypothesis/1")]
    edit = [{"name": "edit_file", "arguments": {"path": "pkg/mod.py", "old": "return [x * k for x in xs]",
                                                "new": "return [k * x for x in xs]"}}]
    runs = [("hypothesis/1", "hypothesis/1"), (None, None), ("hypothesis/9", None)]  # named, none, unknown
    for number, (named, filed) in enumerate(runs):
        script = [[{"name": "read_file", "arguments": {"path": "pkg/long.py"}}], [{"name": "run_tests",
                                                                                    "arguments": {}}],
                  edit, [{"name": "finish", "arguments": {"rationale": "k first", "hypothesis": named}}]]
        with ScriptedLLM(script) as llm, Workspace.create(repo, tmp_path / "home", f"h{number}") as ws:
            context = ProposalContext({"target": {"tests": "echo the-spec-tests-ran && python -m pytest -q tests"}},
                                      hypotheses, [], {}, ws, {})
            proposal = LLMProposer(llm.base_url, "m", tool_output_limit=1500).propose(context)
            tool_results = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
        assert proposal.hypothesis == filed  # never the first open one when the model named none
    read, tests = tool_results[0], tool_results[1]
    assert "characters cut" not in read and read.startswith("     1  value_1 = 1")
    last = int(read.rsplit("\n", 2)[-2].split()[0])  # the last line shown, whole
    assert f"[lines {last + 1}-399 of pkg/long.py not shown (output limit): call read_file with start_line={last + 1}]" \
        in read
    assert tests.startswith("$ echo the-spec-tests-ran") and "the-spec-tests-ran" in tests and "2 passed" in tests


def test_an_earlier_trial_reaches_the_next_proposal_with_its_patch_rationale_and_deciding_gate() -> None:
    from infragent.agent.targets import PATCH_LINES, trial_summary

    long_patch = PATCH + "".join(f"+line {n}\n" for n in range(60))
    trial = {"trial": 0, "status": "not shown", "why": "step bench: not shown (inconclusive after 16 blocks ...)",
             "hypothesis": None, "knobs": {"max_num_seqs": 4}, "rationale": "one multiply per element",
             "patch": long_patch, "local": {"key": "trial/0/step_bench", "verdict": "inconclusive",
                                            "finding": "engine steps candidate/baseline: total x0.97 [0.93, 1.01]"}}
    row = trial_summary(trial)
    assert row["rationale"] == "one multiply per element" and row["knobs"] == {"max_num_seqs": 4}
    assert row["patch"].startswith("diff --git a/pkg/mod.py") and row["patch"].count("\n") == PATCH_LINES
    assert "more lines]" in row["patch"] and row["patch_summary"] == "61 lines added, 0 removed in pkg/mod.py"
    assert row["decided_by"] == {"probe": "step_bench", "verdict": "inconclusive",
                                 "finding": "engine steps candidate/baseline: total x0.97 [0.93, 1.01]"}
    assert "hypothesis" not in row  # it named none


def test_truncate_keeps_head_and_tail() -> None:
    text = "a" * 3000 + "b" * 3000
    cut = truncate(text, 1000)
    assert cut.startswith("a" * 500) and cut.endswith("b" * 500)
    assert "[... 5000 characters cut: showing the first 500 and last 500 ...]" in cut
    assert truncate("short", 1000) == "short"
