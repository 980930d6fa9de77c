"""GEMM through a native BLAS call made with ctypes, holding the GIL or releasing it.

torch releases the GIL inside its operators. A native library called through `ctypes.PyDLL` does not: while
it runs, no other Python thread can run, just as a C++ extension that forgets `gil_scoped_release`. This
is the engine's switch for the second case study in the brief: with `gemm = "blas-gil-held"` the KV-transfer
thread starves during every projection; `gemm = "blas"` makes the same call through `ctypes.CDLL`, which
releases the GIL. Both call the `sgemm_` (Fortran BLAS) that ships inside libtorch_cpu.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from infragent.trace import span


class NativeGemmError(RuntimeError):
    """No usable BLAS sgemm_ in this torch build."""


def _library() -> Path:
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not path.exists():
        raise NativeGemmError(f"gemm: {path} not found; native BLAS GEMM needs a Linux CPU build of torch "
                              "(use gemm = \"torch\")")
    return path


class NativeGemm:
    """y = x · Wt for fp32 row-major x [m, k] and Wt [k, n], through BLAS sgemm_."""

    def __init__(self, release_gil: bool) -> None:
        loader = ctypes.CDLL if release_gil else ctypes.PyDLL
        try:
            self._sgemm = loader(str(_library())).sgemm_
        except AttributeError:
            raise NativeGemmError("gemm: this torch build exports no sgemm_; use gemm = \"torch\"") from None
        self._sgemm.restype = None
        self.release_gil = release_gil
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._no = ctypes.c_char(b"N")

    def __call__(self, x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
        """x @ weight_t (both fp32, contiguous)."""
        if x.dtype != torch.float32 or weight_t.dtype != torch.float32:
            raise NativeGemmError(f"gemm: native BLAS runs fp32 only, got {x.dtype} x {weight_t.dtype}")
        x = x.contiguous()
        m, k = x.shape
        n = weight_t.shape[1]
        y = torch.empty(m, n)
        # Column-major view of row-major buffers: y^T (n x m) = Wt^T (n x k) . x^T (k x m), no transposes.
        dims = [ctypes.c_int(v) for v in (n, m, k)]
        with span("gemm", m=m, n=n, k=k, gil="released" if self.release_gil else "held"):
            self._sgemm(ctypes.byref(self._no), ctypes.byref(self._no), *(ctypes.byref(d) for d in dims),
                        ctypes.byref(self._one), ctypes.c_void_p(weight_t.data_ptr()), ctypes.byref(dims[0]),
                        ctypes.c_void_p(x.data_ptr()), ctypes.byref(dims[2]), ctypes.byref(self._zero),
                        ctypes.c_void_p(y.data_ptr()), ctypes.byref(dims[0]))
        return y


def make_gemm(name: str) -> NativeGemm | None:
    """The GEMM for an engine's `gemm` knob (None: torch.mm)."""
    if name == "torch":
        return None
    return NativeGemm(release_gil=name == "blas")
