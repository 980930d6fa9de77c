"""A running Python server's stacks, sampled from outside by py-spy while load runs: which function each
thread was in while it was on a CPU. py-spy attaches with ptrace and does not pause the server
(--nonblocking); a server that is not Python, or a user who may not trace it, gets a note saying so.
"""
from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from infragent.probes.gil import find_pyspy

# torch's Python and the standard library, in whatever interpreter the server runs: where a hot leaf is one of
# these, the caller that got there says more (the model's layer, not torch's op dispatch)
_LIBRARY = re.compile(r"/torch/|/lib/python3\.\d+/(?!site-packages/|dist-packages/)|^<frozen")
RATE_HZ = 97  # prime: no lock-step with the server's own timers
_PROFILE = re.compile(r'^(?:Process (\d+) )?Thread (\d+)(?: "(.*)")?$')
# frames that turn text into tokens or back, matched on the function and its file's path: ours, HF tokenizers and
# transformers' tokenization_*, vLLM's and llama-cpp-python's tokenizer modules (not SGLang's tokenizer_manager,
# which runs its whole request loop); a bare "encode" would also match JSON encoding
TOKENIZATION = re.compile(r"tokeniz(?!er_manager)|chat_template|\bbpe\b|_bpe", re.IGNORECASE)


@dataclass
class ThreadStacks:
    """One thread's on-CPU samples: how many, the innermost function of each, and how many were in
    tokenization (a tokenization frame anywhere on the stack)."""

    pid: int
    tid: int
    name: str
    samples: int = 0
    functions: Counter = field(default_factory=Counter)  # 'function (file:line)': innermost outside torch/stdlib
    tokenizing: int = 0
    tokenizing_functions: Counter = field(default_factory=Counter)  # the tokenization frame nearest the leaf

    def to_dict(self) -> dict:
        """A JSON-ready copy (the ten most frequent functions)."""
        return {"pid": self.pid, "tid": self.tid, "name": self.name, "samples": self.samples,
                "tokenizing": self.tokenizing, "functions": dict(self.functions.most_common(10)),
                "tokenizing_functions": dict(self.tokenizing_functions.most_common(5))}


@dataclass
class StackSampling:
    """py-spy's samples per thread, the rate, and why there are none when there are none."""

    threads: list[ThreadStacks]
    rate_hz: int
    note: str | None = None
    path: Path | None = None

    def total(self) -> int:
        """Every on-CPU sample of every thread."""
        return sum(t.samples for t in self.threads)


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (py-spy can read it)."""
    try:
        proc = psutil.Process(pid)
        return "python" in Path(proc.exe()).name.lower() or "python" in " ".join(proc.cmdline()[:1]).lower()
    except (psutil.Error, OSError):
        return False


def start_pyspy(pid: int, seconds: float, out: Path,
                rate_hz: int = RATE_HZ) -> tuple[subprocess.Popen | None, str | None]:
    """Start py-spy on pid (and its subprocesses) for seconds; (process, None), or (None, why not)."""
    exe = find_pyspy()
    if exe is None:
        return None, "py-spy not found (pip install py-spy): no Python stacks, thread states only"
    if not is_python(pid):
        return None, f"pid {pid} is not a Python process: no Python stacks, thread states only"
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate_hz),
           "--format", "speedscope", "--nonblocking", "--subprocesses", "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), None


def finish_pyspy(proc: subprocess.Popen, out: Path, pid: int, rate_hz: int = RATE_HZ,
                 timeout_s: float = 30.0) -> StackSampling:
    """Wait for py-spy and read its samples; a failure becomes a note (how to grant ptrace, when that is it)."""
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    if not out.exists():
        return StackSampling([], rate_hz, pyspy_failure(output, pid))
    try:
        return StackSampling(parse_speedscope(json.loads(out.read_text())), rate_hz, path=out)
    except (ValueError, KeyError, TypeError) as err:
        return StackSampling([], rate_hz, f"py-spy's output unreadable ({err}): thread states only")


def pyspy_failure(output: str, pid: int) -> str:
    """One line saying why py-spy took no samples, and what to do when it was refused ptrace."""
    last = next((line for line in reversed(output.strip().splitlines()) if line.strip()), "no output")
    if re.search(r"permission|not permitted|EPERM|ptrace", output, re.IGNORECASE):
        return (f"py-spy may not attach to pid {pid} ({last.strip()}): run diagnose as root or as the server's "
                "user with CAP_SYS_PTRACE, or allow ptrace (sudo sysctl kernel.yama.ptrace_scope=0; in a "
                "container: --cap-add SYS_PTRACE); thread states only")
    return f"py-spy took no samples of pid {pid} ({last.strip()}): thread states only"


def parse_speedscope(data: dict) -> list[ThreadStacks]:
    """Per-thread samples from py-spy's speedscope JSON ('Process P Thread T "name"' profiles), busiest first."""
    frames = data["shared"]["frames"]
    labels = [f"{f.get('name', '?')} ({Path(str(f.get('file', '?'))).name}:{f.get('line', '?')})" for f in frames]
    code = [bool(f.get("file")) for f in frames]  # with --subprocesses, each stack's root names its process
    tokenizing = [c and bool(TOKENIZATION.search(f"{f.get('name', '')} {f.get('file', '')}"))
                  for c, f in zip(code, frames)]
    library = [not c or bool(_LIBRARY.search(str(f.get("file", "")))) for c, f in zip(code, frames)]
    threads = []
    for profile in data.get("profiles", []):
        match = _PROFILE.match(str(profile.get("name", "")))
        if not match:
            continue
        stacks = ThreadStacks(int(match.group(1) or 0), int(match.group(2)), match.group(3) or "")
        for stack in profile.get("samples", []):
            if not stack:
                continue
            stacks.samples += 1
            # the leaf is last; where it is in torch or the standard library, the caller that got there
            stacks.functions[labels[next((i for i in reversed(stack) if not library[i]), stack[-1])]] += 1
            inner = next((i for i in reversed(stack) if tokenizing[i]), None)
            if inner is not None:
                stacks.tokenizing += 1
                stacks.tokenizing_functions[labels[inner]] += 1
        threads.append(stacks)
    return sorted(threads, key=lambda t: -t.samples)
