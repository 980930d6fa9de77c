"""A git checkout of this project with a slowdown planted in the engine's decode path, and the patches a
scripted proposer offers against it (the fix, and fast-but-wrong, slower and neutral ones)."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import infragent

RUNNER = "src/infragent/engine/runner.py"
SAMPLE_LINE = "                logits = self.model.logits(hidden.index_select(0, inputs.logits_rows))\n"
PLANTED = ("                if phase == \"decode\":  # planted: the LM head over every row, three times over\n"
           "                    for _ in range(3):\n"
           "                        self.model.logits(hidden)\n")
SLOWER = ("                for _ in range(6):  # a patch that makes it worse\n"
          "                    self.model.logits(hidden)\n")
NEUTRAL = "                logits_rows = inputs.logits_rows  # a rename that changes nothing\n"
WRONG = ("tokens_out = sample(logits, ", "tokens_out = sample(logits.roll(1, dims=-1), ")


def git(args: list[str], cwd: Path) -> str:
    """git with a fixed identity, its output."""
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def planted_checkout(dest: Path) -> Path:
    """dest: src/infragent copied from this project, committed, then the planted slowdown committed on top."""
    shutil.copytree(Path(infragent.__file__).resolve().parent, dest / "src" / "infragent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    git(["init", "-q", "-b", "main"], dest)
    git(["add", "-A"], dest)
    git(["commit", "-q", "-m", "infragent as it is"], dest)
    runner = dest / RUNNER
    text = runner.read_text()
    assert SAMPLE_LINE in text, "the runner's sampling line moved: update tests/engine_checkout.py"
    runner.write_text(text.replace(SAMPLE_LINE, PLANTED + SAMPLE_LINE))
    git(["commit", "-q", "-am", "a slowdown in the decode path"], dest)
    return dest


def fingerprint(checkout: Path) -> dict[str, str]:
    """The user's side of a checkout: every file of its tree, its index file, HEAD, the branches and the status
    (git's object store may gain objects from worktrees; nothing the user sees does)."""
    files = {str(p.relative_to(checkout)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(checkout.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
             and p.relative_to(checkout).parts[0] != ".git"}
    files[".git/index"] = hashlib.sha256((checkout / ".git" / "index").read_bytes()).hexdigest()
    files["HEAD"] = git(["rev-parse", "HEAD"], checkout)
    files["branches"] = git(["branch", "-a", "-v"], checkout)
    files["status"] = git(["status", "--porcelain", "--ignored"], checkout)
    return files


def proposer_script(path: Path, sequence: list[str]) -> Path:
    """A command proposer that edits the worktree's runner: the n-th call applies sequence[n] (fix, wrong,
    slower, slower2, neutral), counting calls in a file next to the script."""
    path.write_text(f'''import json, pathlib, sys
context = json.load(sys.stdin)
counter = pathlib.Path({str(path.with_suffix(".calls"))!r})
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
kind = {sequence!r}[min(n, {len(sequence) - 1})]
runner = pathlib.Path(context["workspace"]) / {RUNNER!r}
text = runner.read_text()
if kind in ("fix", "wrong"):
    text = text.replace({PLANTED!r}, "")
if kind == "wrong":
    text = text.replace({WRONG[0]!r}, {WRONG[1]!r})
if kind == "slower":
    text = text.replace({SAMPLE_LINE!r}, {SLOWER!r} + {SAMPLE_LINE!r})
if kind == "slower2":
    text = text.replace("for _ in range(3):", "for _ in range(5):")
if kind == "neutral":
    text = text.replace({SAMPLE_LINE!r}, {NEUTRAL!r} + {SAMPLE_LINE!r})
runner.write_text(text)
print(json.dumps({{"rationale": kind}}))
''')
    return path
