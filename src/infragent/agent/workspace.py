"""A candidate's workspace: a detached git worktree of the code under optimization, and sandboxed runs in it.

The user's tree is never touched: no file, index, HEAD or branch of theirs changes. Uncommitted edits in the
source folder are copied into the worktree and committed there (detached, no branch) as the starting point,
so a candidate's diff applies to what the user sees. Code outside any git repository (e.g. a pack inside
site-packages) is first copied into a private repository under `home/sources/<content hash>`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

# Every git call: no hooks of the user's repo run, no opportunistic index refresh, a/ b/ prefixes whatever
# the user's diff config says, and no signing prompts for our own snapshot commits.
_GIT_CONFIG = [
    "-c", "core.hooksPath=/dev/null", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
    "-c", "commit.gpgsign=false", "-c", "user.name=infragent", "-c", "user.email=infragent@localhost",
]
_JUNK = ["__pycache__/", "*.py[cod]", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", ".ipynb_checkpoints/"]
_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_SKIP_COPY = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "*.pyo", ".pytest_cache")


class WorkspaceError(RuntimeError):
    """A workspace operation failed; the message names the path or command and what to do."""


@dataclass
class Completed:
    """The outcome of one sandboxed run."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


class Workspace:
    """A detached git worktree holding one candidate's code."""

    def __init__(self, path: Path, root: Path, repo: Path, name: str, base: str, start: str, home: Path) -> None:
        self.path = path  # the worktree's top
        self.root = root  # the folder in the worktree that corresponds to the source
        self.repo = repo  # the repository the worktree belongs to
        self.name = name
        self.base = base  # the source's HEAD commit
        self.start = start  # the commit the candidate starts from: base plus the source's uncommitted edits
        self.home = home
        self._removed = False

    @classmethod
    def create(cls, source: Path, home: Path, name: str) -> "Workspace":
        """A worktree at home/worktrees/name holding what the user sees in `source`."""
        source = Path(source).resolve()
        home = Path(home).resolve()
        if not source.is_dir():
            raise WorkspaceError(f"{source}: not a folder; point the workspace at the folder holding the code")
        if not name or "/" in name or name.startswith("."):
            raise WorkspaceError(f"workspace name {name!r}: use a plain name without '/' or a leading '.'")
        path = home / "worktrees" / name
        if path.exists():
            raise WorkspaceError(f"{path} already exists: remove that workspace first or choose another name")
        path.parent.mkdir(parents=True, exist_ok=True)
        repo = _tracking_repo(source)
        if repo is None:
            repo, relative = _private_repo(source, home), PurePosixPath(".")
        else:
            relative = PurePosixPath(source.relative_to(repo).as_posix())
        base = _git(["rev-parse", "HEAD"], repo).strip()
        _git(["worktree", "prune"], repo)
        _git(["worktree", "add", "--detach", str(path), base], repo)
        workspace = cls(path, path / relative, repo, name, base, base, home)
        try:
            workspace.start = workspace._carry_uncommitted(repo, relative)
        except BaseException:
            workspace.remove()
            raise
        return workspace

    def _carry_uncommitted(self, repo: Path, relative: PurePosixPath) -> str:
        """Copy the source's uncommitted files into the worktree and commit them there; the start commit."""
        changed = _git(["diff", "HEAD", "--name-only", "--no-renames", "-z", "--", str(relative)], repo)
        untracked = _git(["ls-files", "--others", "--exclude-standard", "-z", "--", str(relative)], repo)
        names = sorted({n for n in (changed + untracked).split("\0") if n})
        if not names:
            return self.base
        for name in names:
            mine, theirs = repo / name, self.path / name
            if mine.is_dir() and not mine.is_symlink():
                continue  # a submodule: worktrees do not check those out
            if theirs.is_symlink() or theirs.is_file():
                theirs.unlink()
            if mine.is_symlink() or mine.exists():
                theirs.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(mine, theirs, follow_symlinks=False)
        self._git(["add", "-A", "-f", "--", *names])
        message = f"infragent: uncommitted changes under {relative}"
        self._git(["commit", "-q", "--no-verify", "--allow-empty", "-m", message])
        return self._git(["rev-parse", "HEAD"]).strip()

    def apply(self, patch: str, code_prefix: str | None = None) -> None:
        """Apply a unified diff (paths relative to the worktree, a/ b/ prefixes) or raise with git's message.
        code_prefix: where the code folder sat in the tree the patch was made in, when that tree differs from
        this one (a node whose code came without the driver's repository): paths are moved to this root."""
        if not patch.strip():
            raise WorkspaceError("the patch is empty: nothing to apply")
        paths = _patch_paths(patch)
        for target in paths:
            _confined(target)
        moved: list[str] = []  # git apply's options that move the paths from the patch's root to ours
        here = self.code_prefix()
        if code_prefix is not None and code_prefix != here:
            if code_prefix != ".":
                outside = next((p for p in paths if not p.startswith(code_prefix + "/")), None)
                if outside is not None:
                    raise WorkspaceError(f"the patch changes {outside}, outside the code folder {code_prefix}, "
                                         f"which {self.path} does not hold")
            moved.append(f"-p{1 + len(PurePosixPath(code_prefix).parts)}")  # '.' has no parts
            if here != ".":
                moved.append(f"--directory={here}")
        if not patch.endswith("\n"):
            patch += "\n"
        for check in (["--check"], []):
            try:
                self._git(["apply", *check, *moved, "--whitespace=nowarn", "-"], stdin=patch)
            except WorkspaceError as e:
                raise WorkspaceError(f"the patch does not apply to {self.path}: {e}") from None

    def code_prefix(self) -> str:
        """The code folder's path in the worktree, as a patch names it ('.' for the top)."""
        return self.root.relative_to(self.path).as_posix()

    def code_tree(self) -> str:
        """The git id of the code folder's content at the start: equal ids, equal files."""
        prefix = self.code_prefix()
        return self._git(["rev-parse", f"{self.start}^{{tree}}" if prefix == "." else f"{self.start}:{prefix}"]).strip()

    def diff(self) -> str:
        """The candidate patch: everything changed in the worktree since the start, new files included."""
        self._git(["add", "-A"])
        return self._git(["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", self.start])

    def resolve(self, relative: str) -> Path:
        """The path `relative` names inside the worktree; raises on anything that would leave it."""
        parts = _confined(str(relative))
        top = self.path.resolve()
        resolved = top.joinpath(*parts).resolve()
        if resolved != top and top not in resolved.parents:
            raise WorkspaceError(f"{relative}: leads outside the workspace (through a symlink); use a path inside it")
        return resolved

    def run(self, argv: list[str], timeout_s: float, memory_gb: float | None = 4.0, env: dict | None = None,
            cwd: Path | None = None, stdin: str | None = None) -> Completed:
        """Run argv (cwd: the root) in its own process group under an address-space limit; see run_limited."""
        return run_limited(argv, cwd or self.root, timeout_s, memory_gb, env, stdin)

    def export(self, dest: Path, evidence: dict[str, Any]) -> Path:
        """Write dest/<name>.patch and dest/<name>.evidence.json; the patch's path."""
        patch = self.diff()
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        patch_path = dest / f"{self.name}.patch"
        patch_path.write_text(patch)
        record = {**evidence, "base_commit": self.base, "patch_sha256": hashlib.sha256(patch.encode()).hexdigest()}
        if self.start != self.base:
            record["start_commit"] = self.start  # base plus the uncommitted edits the candidate started from
        (dest / f"{self.name}.evidence.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        return patch_path

    def remove(self) -> None:
        """Delete the worktree and its registration in the repository; safe to call twice."""
        if self._removed:
            return
        if self.path.exists():
            try:
                _git(["worktree", "remove", "--force", str(self.path)], self.repo)
            except WorkspaceError:
                shutil.rmtree(self.path, ignore_errors=True)  # not registered (any more): just files
        _git(["worktree", "prune"], self.repo)
        self._removed = True

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _git(self, args: list[str], stdin: str | None = None) -> str:
        excludes = self.home / "worktrees" / ".excludes"
        if not excludes.exists():
            excludes.write_text("\n".join(_JUNK) + "\n")
        return _git(["-c", f"core.excludesFile={excludes}", *args], self.path, stdin)


def _git(args: list[str], cwd: Path, stdin: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    argv = ["git", *_GIT_CONFIG, *args]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                              encoding="utf-8", errors="replace", timeout=300)
    except FileNotFoundError as e:
        raise WorkspaceError("git is not installed: install git to use code workspaces") from e
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        raise WorkspaceError(f"`git {' '.join(args)}` in {cwd} failed (rc {done.returncode}): {message}")
    return done.stdout


def _tracking_repo(source: Path) -> Path | None:
    """The repository whose HEAD holds `source`, or None (no repo, no commit yet, or source not tracked)."""
    try:
        top = Path(_git(["rev-parse", "--show-toplevel"], source).strip()).resolve()
        _git(["rev-parse", "--verify", "-q", "HEAD"], top)
        tracked = _git(["ls-tree", "--name-only", "HEAD", "--", source.relative_to(top).as_posix()], top)
    except WorkspaceError:
        return None
    return top if tracked.strip() else None  # an ignored folder (a venv in the repo) is not in HEAD


def _private_repo(source: Path, home: Path) -> Path:
    """A one-commit repository holding a copy of `source`, made once per content."""
    sources = home / "sources"
    repo = sources / _content_hash(source)
    if (repo / ".git").exists():
        return repo
    sources.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=sources))
    try:
        copy = staging / "tree"
        shutil.copytree(source, copy, symlinks=True, ignore=_SKIP_COPY)
        _git(["init", "-q"], copy)
        _git(["add", "-A", "-f"], copy)
        _git(["commit", "-q", "--no-verify", "--allow-empty", "-m", f"infragent: copy of {source}"], copy)
        try:
            copy.rename(repo)
        except OSError:
            if not (repo / ".git").exists():  # not a concurrent twin that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return repo


def _content_hash(source: Path) -> str:
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__", ".pytest_cache"))
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(folder) / name
            digest.update(path.relative_to(source).as_posix().encode() + b"\0")
            digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def _patch_paths(patch: str) -> list[str]:
    """Every path a unified diff's headers name (renames and copies too), a/ b/ prefixes stripped."""
    paths: list[str] = []
    old = new = 0  # lines left in the current hunk: inside one, '--- x' is a removed line, not a header
    for line in patch.splitlines():
        if old > 0 or new > 0:
            kind = line[:1]
            if kind == "-":
                old -= 1
            elif kind == "+":
                new -= 1
            elif kind != "\\":  # a context line; an empty line is one whose space was stripped
                old, new = old - 1, new - 1
            continue
        if line.startswith("@@ "):
            match = _HUNK.match(line)
            if match:
                old, new = (int(n) if n is not None else 1 for n in match.group(1, 2))
        elif line.startswith("diff --git "):
            paths += [_unprefixed(p) for p in line[len("diff --git "):].split(" ")]
        elif line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null":
                paths.append(_unprefixed(name))
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.append(line.split(" ", 2)[2])
    return paths


def _unprefixed(name: str) -> str:
    name = name.strip('"')
    return name[2:] if name[:2] in ("a/", "b/") else name


def _confined(relative: str) -> tuple[str, ...]:
    """The parts of a relative path that stays inside its folder; raises on absolute, '..' or .git paths."""
    if not relative or relative.startswith(("/", "~")) or os.path.isabs(relative):
        raise WorkspaceError(f"{relative!r}: use a path relative to the workspace root, not an absolute one")
    parts = PurePosixPath(relative.replace("\\", "/")).parts
    if ".." in parts:
        raise WorkspaceError(f"{relative!r}: '..' would leave the workspace; use a path inside it")
    if ".git" in parts:
        raise WorkspaceError(f"{relative!r}: the .git folder is not part of the code; leave it alone")
    return parts


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_limited(argv: list[str], cwd: Path, timeout_s: float, memory_gb: float | None = 4.0, env: dict | None = None,
                stdin: str | None = None) -> Completed:
    """Run argv in its own process group under an address-space limit; on timeout kill the whole group."""
    environment = {**os.environ, **(env or {})}
    limit = None if memory_gb is None else int(memory_gb * 1024**3)
    started = time.perf_counter()
    try:
        process = subprocess.Popen(
            argv, cwd=cwd, env=environment, text=True, encoding="utf-8", errors="replace",
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=None if limit is None else lambda: _limit_memory(limit))
    except OSError as e:
        raise WorkspaceError(f"cannot start {argv[0]!r}: {e}; check the command and that it is installed") from e
    timed_out = False
    try:
        stdout, stderr = process.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a descendant left the group and holds the pipes open
            process.kill()
            process.wait()
            stdout, stderr = "", ""
    finally:
        _kill_group(process.pid)  # stragglers a finished program left behind
    rc = -signal.SIGKILL if timed_out else process.returncode
    return Completed(list(argv), rc, stdout or "", stderr or "", time.perf_counter() - started, timed_out)
