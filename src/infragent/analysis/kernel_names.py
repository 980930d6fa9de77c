"""GPU kernel names for humans and kinds for breakdowns.

Kernel names run to hundreds of characters of C++ templates. `short_name` keeps the kernel's own name and the
operation it was instantiated for ("vectorized_elementwise_kernel[gelu]"); mangled names (`_Z...`) are demangled
with c++filt where it exists. `kernel_kind` sorts kernels into GEMM, attention, elementwise/reduction, memory,
communication and other; `kernel_source` says who wrote it (ATen, Triton, cuBLAS/CUTLASS, cuDNN, ...).
`hta_kind` is HTA's coarser class (computation, communication, memory, other), used by the temporal breakdown.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache

KINDS = ("gemm", "attention", "elementwise/reduction", "memory", "communication", "other")

_COMM = re.compile(r"nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deep_?ep|"
                   r"dispatch_kernel|combine_kernel", re.I)
_MEMORY = re.compile(r"^(Memcpy|Memset)|^\[?memcpy|^\[?memset", re.I)
_ATTENTION = re.compile(r"flash|fmha|sdpa|attention|attn|xformers|_fwd_kernel|mha_|paged_kv|unified_attention", re.I)
_GEMM = re.compile(r"gemm|gemv|nvjet|xmma|cublas|cutlass|matmul|triton_(tem|mm)|_mm_|splitk|s16816|s1688|h884|"
                   r"h1688|tensorop|wgmma|bmm|grouped_mm|scaled_mm|marlin|machete", re.I)
_ELEMENTWISE = re.compile(r"elementwise|reduce|softmax|norm|copy|cat_?array|gather|scatter|index|fill|arange|"
                          r"triton_(poi|red|per)|rms|rope|rotary|silu|gelu|act_and_mul|topk|sort|embedding|cumsum|"
                          r"where|argmax|sampl|transpose|permute|pad|mask|dropout|scan|unary|binary|distribution",
                          re.I)
_HTA_NCCL = re.compile(r"nccl.*Kernel")
_HTA_MEMORY = re.compile(r"Memcpy|Memset|dma")


def hta_kind(name: str) -> str:
    """HTA's kernel classes: communication (NCCL kernels), memory (Memcpy/Memset/dma), computation, other."""
    if _HTA_NCCL.match(name):
        return "communication"
    if _HTA_MEMORY.match(name):
        return "memory"
    if "Memcpy" in name or "Sync" in name:  # HTA leaves these out of computation without calling them memory
        return "other"
    return "computation"


def kernel_kind(name: str, category: str = "kernel") -> str:
    """GEMM, attention, elementwise/reduction, memory, communication or other."""
    if category in ("gpu_memcpy", "gpu_memset") or _MEMORY.search(name):
        return "memory"
    if _COMM.search(name):
        return "communication"
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    if _ELEMENTWISE.search(name) or "at::native" in name:
        return "elementwise/reduction"
    return "other"


def kernel_source(name: str, category: str = "kernel") -> str:
    """Who wrote the kernel, from its name: ATen, Triton, cuBLAS/CUTLASS, cuDNN, FlashAttention, NCCL, copy engine."""
    lowered = name.lower()
    if category in ("gpu_memcpy", "gpu_memset") or _MEMORY.search(name):
        return "copy engine"
    for needle, source in (("triton", "Triton"), ("nccl", "NCCL"), ("cudnn", "cuDNN"), ("flash", "FlashAttention"),
                           ("nvjet", "cuBLAS"), ("cublas", "cuBLAS"), ("cutlass", "CUTLASS"), ("xmma", "cuBLAS"),
                           ("gemm", "cuBLAS"), ("at::native", "ATen"), ("c10::", "ATen")):
        if needle in lowered:
            return source
    return "other"


_GENERIC = {"at", "native", "c10", "std", "array", "char", "int", "unsigned", "long", "float", "double", "bool",
            "BFloat16", "Half", "Float8_e4m3fn", "void", "const", "operator", "lambda", "anonymous", "namespace",
            "gpu_kernel_impl_nocast", "gpu_kernel_impl", "BinaryFunctor", "AUnaryFunctor", "BUnaryFunctor",
            "binary_internal", "TensorIteratorBase", "TrivialOffsetCalculator", "OffsetCalculator", "ReduceOp",
            "ul", "u", "detail", "Array", "func_wrapper", "OpaqueType", "LoadWithoutCast", "StoreWithoutCast",
            "LoadWithCast", "StoreWithCast", "memory", "policies", "vectorized", "unroll", "Params", "cutlass",
            "Kernel", "Kernel2", "GeluType", "Scalar", "Tensor", "TensorIterator", "cuda", "uint8_t", "int64_t"}
_OP = re.compile(r"^(?:CUDAFunctor(?:OnSelf)?_(\w+)|(\w+?)(?:_kernel_cuda|_kernel_impl|_cuda_out|_kernel|"
                 r"CUDAKernelImpl|KernelImpl|Functor|Ops|_impl))$")
MAX_SHORT = 80
_WRAPPERS = {"Kernel", "Kernel2", "device_kernel", "kernel", "GenericKernel"}


def short_name(name: str) -> str:
    """A kernel name people can read: its own name plus the operation its templates name, at most 80 chars."""
    if name.startswith("_Z"):
        name = demangle(name)
    if _MEMORY.search(name) or ("<" not in name and "(" not in name):
        return name if len(name) <= MAX_SHORT else name[:MAX_SHORT - 1] + "…"
    text = name.replace("(anonymous namespace)", "anon").removeprefix("void ").strip()
    head, inner = _split_template(text)
    base = head.split("::")[-1] or head
    if base in _WRAPPERS:  # cutlass::Kernel2<the_real_kernel>: the template argument is the kernel
        base = next((t for t in re.findall(r"[A-Za-z_]\w*", inner) if t not in _GENERIC), base)
    op = _operation(inner)
    short = f"{base}[{op}]" if op and op.lower() not in base.lower() else base
    return short if len(short) <= MAX_SHORT else short[:MAX_SHORT - 1] + "…"


def _split_template(text: str) -> tuple[str, str]:
    """The name before its first top-level '<' or '(', and everything after it."""
    for i, ch in enumerate(text):
        if ch in "<(":
            return text[:i].strip(), text[i:]
    return text, ""


def _operation(inner: str) -> str:
    """The first identifier in the template/argument text that names an operation (Mul, gelu, direct_copy...)."""
    for token in re.findall(r"[A-Za-z_]\w*", inner):
        if token in _GENERIC:
            continue
        m = _OP.match(token)
        if m:
            op = m.group(1) or m.group(2)
            if op and op not in _GENERIC and op not in ("Binary", "Unary", "AUnary", "BUnary", "gpu"):
                return op[0].lower() + op[1:]
    return ""


@lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """C++ demangling through c++filt when installed; the name itself otherwise."""
    tool = shutil.which("c++filt")
    if tool is None:
        return name
    try:
        out = subprocess.run([tool, name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return name
    return out.stdout.strip() or name
