"""The environment a number was measured in: CPU/GPU, package versions, git commit and the dirty diff."""
from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from typing import Any

from infragent.probes.machine import cpu_flags, cpu_model

PACKAGES = ("infragent", "torch", "numpy", "scipy", "fastapi", "uvicorn", "transformers", "vllm", "sglang")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def capture() -> dict[str, Any]:
    """A JSON-safe description of this machine and checkout."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        torch_threads = torch.get_num_threads()
    except ImportError:
        torch_threads = None
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    diff = _git("diff", "HEAD")
    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "platform": platform.platform(), "packages": versions, "torch_threads": torch_threads,
            "git_commit": commit, "git_dirty": bool(diff),
            "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None}
