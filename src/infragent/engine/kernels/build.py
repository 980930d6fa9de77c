"""Compile the kernels (*.cpp here) with torch's extension builder and register their ops as torch.ops.infragent.*.

The build runs once per (source, torch version, CPU) and is cached under ~/.cache/infragent/kernels (or
$INFRAGENT_KERNEL_CACHE); it needs a C++ compiler, the Python headers and ninja. Where it cannot build,
`available()` says so once in the log and the engine runs its torch-op path instead.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import sysconfig
import threading
from pathlib import Path
from typing import Iterator

import torch

from infragent.engine.options import ConfigError

HERE = Path(__file__).parent
SOURCES = [HERE / "paged_attention.cpp", HERE / "fused_layers.cpp", HERE / "scaled_kv.cpp", HERE / "decode_stack.cpp"]
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # no -fopenmp at link: torch's own OpenMP runtime is used
# The quantized-weight products pick their instruction set at run time (AVX-512, AVX2 or baseline, each
# compiled in by a target pragma), so their library is built for the baseline CPU, not -march=native: the
# AVX2 path must not pick up AVX-512 instructions on a machine that has them.
QGEMM_SOURCES = [HERE / "qgemm.cpp", HERE / "qgemm_a8.cpp"]
QGEMM_CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast", "-Wno-psabi"]

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
    texts = [path.read_bytes() for path in sorted(HERE.glob("*.cpp")) + sorted(HERE.glob("*.h"))]
    key = hashlib.sha256(b"\0".join([*texts, torch.__version__.encode(), " ".join(CFLAGS + QGEMM_CFLAGS).encode(),
                                     _cpu_signature().encode()])).hexdigest()[:16]
    root = Path(os.environ.get("INFRAGENT_KERNEL_CACHE", Path.home() / ".cache" / "infragent" / "kernels"))
    return f"infragent_kernels_{key}", root / key


def cache_directory() -> Path:
    """The folder this machine's build of these kernel sources lives in (keyed by sources, flags and CPU)."""
    return _build_directory()[1]


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the build folder's lock (an flock: released when its holder dies, however it dies). Holding it, a
    torch `lock` file left there is stale — a build killed part-way — and would make every later start wait on
    it forever, so it goes."""
    with open(directory / ".infragent.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
            with build_lock(directory):
                for library, sources, flags, folder in ((name, SOURCES, CFLAGS, directory),
                                                        (name.replace("kernels", "qgemm"), QGEMM_SOURCES,
                                                         QGEMM_CFLAGS, directory / "qgemm")):
                    built = folder / f"{library}.so"
                    if built.exists():  # the same sources were built before (maybe from another copy of the code)
                        torch.ops.load_library(str(built))
                        continue
                    folder.mkdir(exist_ok=True)
                    load_extension(name=library, sources=[str(path) for path in sources], extra_cflags=flags,
                                   is_python_module=False, build_directory=str(folder), verbose=False)
        except Exception as exc:  # compiler, headers or ninja missing; a failed compile
            lines = str(exc).strip().splitlines()
            reason = next((line for line in lines if "error:" in line), lines[-1] if lines else type(exc).__name__)
            _error = (f"native kernels ({HERE}) did not build: {reason.strip()}; "
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
            log.warning("%s; using the torch-op path", exc)
        return False
    return True


def use_native_kernels(choice: str, dtype: torch.dtype, sizes: dict[str, int]) -> bool:
    """Whether the engine runs the native kernels under the `kernels` knob (auto: where they apply). They run
    fp32 with every size in `sizes` (head_dim, hidden_size, intermediate_size) a multiple of 16."""
    if choice == "torch":
        return False
    misfits = [f"{name} {size}" for name, size in sizes.items() if size % 16]
    if dtype != torch.float32:
        misfits.insert(0, f"dtype {dtype}")
    if choice == "auto":
        return not misfits and available()
    if misfits:
        raise ConfigError(f"kernels: native runs fp32 with sizes that are multiples of 16, not {', '.join(misfits)}; "
                          "use auto or torch")
    try:
        load()
    except KernelBuildError as exc:
        raise ConfigError(f"kernels: {exc}; use auto or torch") from None
    return True


def use_block_kernels(choice: str) -> bool:
    """Whether stored-block weights (weight_format gguf or int8) run the native kernels under the `kernels`
    knob: auto where they build, native (error if they cannot), torch never (a dequantization per product)."""
    if choice == "torch":
        return False
    if choice == "auto":
        return available()
    try:
        load()
    except KernelBuildError as exc:
        raise ConfigError(f"kernels: {exc}; use auto or torch") from None
    return True
