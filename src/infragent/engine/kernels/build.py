"""Compile paged_attention.cpp with torch's extension builder and register its ops as torch.ops.infragent.*.

The build runs once per (source, torch version, CPU) and is cached under ~/.cache/infragent/kernels (or
$INFRAGENT_KERNEL_CACHE); it needs a C++ compiler, the Python headers and ninja. Where it cannot build,
`available()` says so once in the log and the engine runs its torch-op path instead.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import sysconfig
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # no -fopenmp at link: torch's own OpenMP runtime is used
ATTENTION_BACKENDS = ("auto", "native", "torch")

log = logging.getLogger(__name__)
_lock = threading.Lock()
_error: str | None = None
_loaded = False


class KernelBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded here; the message says what is missing."""


def _cpu_signature() -> str:
    """The CPU's model and feature flags (-march=native code is only valid on the same kind of CPU)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(keep)


def _build_directory() -> tuple[str, Path]:
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), torch.__version__.encode(), " ".join(CFLAGS).encode(),
                                     _cpu_signature().encode()])).hexdigest()[:16]
    root = Path(os.environ.get("INFRAGENT_KERNEL_CACHE", Path.home() / ".cache" / "infragent" / "kernels"))
    return f"infragent_kernels_{key}", root / key


def load() -> None:
    """Compile (once) and load the kernels; raise KernelBuildError saying why not."""
    global _error, _loaded
    with _lock:
        if _loaded:
            return
        if _error is not None:
            raise KernelBuildError(_error)
        try:
            from torch.utils.cpp_extension import load as load_extension

            name, directory = _build_directory()
            directory.mkdir(parents=True, exist_ok=True)
            scripts = sysconfig.get_path("scripts")  # the venv's bin holds the ninja of the `ninja` package
            if scripts not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + scripts
            load_extension(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, is_python_module=False,
                           build_directory=str(directory), verbose=False)
        except Exception as exc:  # compiler, headers or ninja missing; a failed compile
            lines = str(exc).strip().splitlines()
            _error = (f"native kernels ({SOURCE.name}) did not build: {lines[-1] if lines else type(exc).__name__}; "
                      "they need a C++ compiler, the Python headers and ninja")
            raise KernelBuildError(_error) from exc
        _loaded = True


def available() -> bool:
    """Whether the native kernels are loaded (building them if needed); logs once when they cannot be."""
    first_failure = _error is None and not _loaded
    try:
        load()
    except KernelBuildError as exc:
        if first_failure:
            log.warning("%s; using the torch-op attention path", exc)
        return False
    return True


def use_native_attention(backend: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether attention runs the native kernels under the attention_backend knob (auto: where they apply)."""
    from infragent.engine.config import ConfigError

    if backend == "torch":
        return False
    fits = dtype == torch.float32 and head_dim % 16 == 0
    if backend == "auto":
        return fits and available()
    if not fits:
        raise ConfigError(f"attention_backend: native runs fp32 with head_dim a multiple of 16, not {dtype} with "
                          f"head_dim {head_dim}; use auto or torch")
    try:
        load()
    except KernelBuildError as exc:
        raise ConfigError(f"attention_backend: {exc}; use auto or torch") from None
    return True
