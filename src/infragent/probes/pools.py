"""The thread pools inside this process (BLAS, OpenMP, torch's intra-op pool), and how to cap each one:
what self-contention advice names. threadpoolctl finds the native libraries' pools; torch's is asked directly
when torch is loaded."""
from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ThreadPool:
    """One pool: its kind (blas, openmp, torch), the library behind it, and its size."""

    kind: str
    library: str
    threads: int

    def to_dict(self) -> dict[str, object]:
        """Plain data."""
        return asdict(self)


def thread_pools(torch_used: bool = True) -> tuple[ThreadPool, ...]:
    """The pools of this process with more than one thread, BLAS first, each (kind, library, size) once.
    torch_used=False leaves out torch's pool and the libraries torch ships (its OpenMP): a workload whose code
    never reaches torch does not run them, even where torch is loaded."""
    found: list[ThreadPool] = []
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "") if torch is not None else ""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if not torch_used and torch_dir and str(info.get("filepath", "")).startswith(torch_dir + os.sep):
                continue
            if int(info.get("num_threads", 1)) > 1:
                library = info.get("prefix") if info.get("internal_api") == "openmp" else info.get("internal_api")
                found.append(ThreadPool(str(info.get("user_api", "?")), str(library or "?"), int(info["num_threads"])))
    except Exception:  # noqa: BLE001 (no threadpoolctl, or a library it cannot read: no pools named)
        pass
    if torch_used and torch is not None and torch.get_num_threads() > 1:
        found.append(ThreadPool("torch", "intra-op", torch.get_num_threads()))
    order = list(NAMES)
    return tuple(sorted(dict.fromkeys(found), key=lambda p: order.index(p.kind) if p.kind in order else len(order)))


NAMES = {"blas": "BLAS", "openmp": "OpenMP", "torch": "torch"}


def pool_kinds(pools: tuple[ThreadPool, ...]) -> str:
    """'BLAS', 'BLAS, OpenMP and torch', or 'this process' when no pool was found."""
    kinds = list(dict.fromkeys(NAMES.get(p.kind, p.kind) for p in pools))
    return (", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]) if kinds else "this process"


def describe_pools(pools: tuple[ThreadPool, ...]) -> str:
    """'BLAS (openblas) 2 threads each, OpenMP (libgomp) 2' or 'no thread pool found: threads of its own'."""
    if not pools:
        return "no thread pool found: threads of its own"
    return ", ".join(f"{NAMES.get(p.kind, p.kind)} ({p.library}) {p.threads} threads each" for p in pools)


def cap_advice(pools: tuple[ThreadPool, ...], cores: int) -> str:
    """How to cap each pool found (for a workload that runs its own threads: 1 thread per pool, or cores
    divided among them); a thread count to lower when no pool was found."""
    said = []
    for pool in pools:
        if pool.kind == "blas":
            said.append(f"cap BLAS ({pool.library}): threadpoolctl.threadpool_limits(1, user_api='blas') around the "
                        f"threaded code, or {_blas_variable(pool.library)}=1 before numpy is imported")
        elif pool.kind == "openmp":
            said.append(f"cap OpenMP ({pool.library}): OMP_NUM_THREADS=1 in the environment, or "
                        "threadpoolctl.threadpool_limits(1, user_api='openmp')")
        elif pool.kind == "torch":
            said.append(f"cap torch's pool: torch.set_num_threads(1) (or {cores} divided among your threads)")
    return "; ".join(said) or f"run at most {cores} busy threads: the workload's own threads outnumber the cores"


def _blas_variable(library: str) -> str:
    return {"openblas": "OPENBLAS_NUM_THREADS", "mkl": "MKL_NUM_THREADS", "blis": "BLIS_NUM_THREADS"}.get(
        library, "OMP_NUM_THREADS")
