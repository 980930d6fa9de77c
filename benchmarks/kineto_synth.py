"""A synthetic Kineto (torch.profiler) trace with N GPU kernels, shaped like a real training/serving step:
one host thread issues `aten::` ops, each launching one kernel (cpu_op > cuda_runtime > kernel, with the
correlation ids and args Kineto writes); compute kernels run on stream 7, NCCL kernels on stream 20
(partly overlapping compute), Memcpy/Memset on stream 7 between them. Integer µs timestamps.

    PYTHONPATH=src .venv/bin/python benchmarks/kineto_synth.py OUT.json --kernels 1000000
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COMPUTE = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "ampere_sgemm_128x64_tn", "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t>, "
    "true, false, false, false, true, true, false>(Flash_fwd_params)",
]
COMM = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"]
MEMORY = ["Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "Memcpy DtoD (Device -> Device)"]
OPS = {"computation": "aten::mm", "communication": "record_param_comms", "memory": "aten::copy_"}
LAUNCH = {"computation": "cudaLaunchKernel", "communication": "cudaLaunchKernel", "memory": "cudaMemcpyAsync"}
CATEGORY = {"computation": "kernel", "communication": "kernel", "memory": "gpu_memcpy"}


def events(kernels: int, seed: int = 0):  # noqa: ANN201
    """Yield the trace events one by one (host op, its runtime launch, its kernel)."""
    rng = random.Random(seed)
    host, gpu_free, comm_free = 1_000, 1_050, 1_050
    for i in range(kernels):
        roll = rng.random()
        kind = "communication" if roll < 0.10 else "memory" if roll < 0.15 else "computation"
        names = {"computation": COMPUTE, "communication": COMM, "memory": MEMORY}[kind]
        name = names[rng.randrange(len(names))]
        op_dur = rng.randint(4, 12)
        launch_ts, launch_dur = host + rng.randint(1, 2), rng.randint(2, op_dur - 1)
        corr = 100_000 + i
        yield {"ph": "X", "cat": "cpu_op", "name": OPS[kind], "pid": 4242, "tid": 4242, "ts": host, "dur": op_dur,
               "args": {"External id": i + 1, "Sequence number": i, "Fwd thread id": 0, "Record function id": 0,
                        "Ev Idx": 3 * i}}
        yield {"ph": "X", "cat": "cuda_runtime", "name": LAUNCH[kind], "pid": 4242, "tid": 4242, "ts": launch_ts,
               "dur": launch_dur, "args": {"External id": i + 1, "cbid": 211, "correlation": corr}}
        stream = 20 if kind == "communication" else 7
        ready = launch_ts + launch_dur + rng.randint(0, 3)
        start = max(ready, comm_free if stream == 20 else gpu_free) + (rng.randint(0, 6) if rng.random() < 0.2 else 0)
        dur = rng.randint(20, 90) if kind == "communication" else rng.randint(2, 40)
        if stream == 20:
            comm_free = start + dur
        else:
            gpu_free = start + dur
        args = {"External id": i + 1, "queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 2.0,
                "grid": [54, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3}
        yield {"ph": "X", "cat": CATEGORY[kind] if not name.startswith("Memset") else "gpu_memset", "name": name,
               "pid": 0, "tid": stream, "ts": start, "dur": dur, "args": args}
        host += op_dur + rng.randint(1, 4)
        if host < start - 2000:  # the host runs ahead of the GPU by at most ~2 ms, as a real queue does
            host = start - 2000


def write(path: str | Path, kernels: int, seed: int = 0) -> Path:
    """Write the trace (Kineto JSON object form, with thread names and distributedInfo)."""
    path = Path(path)
    meta = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 20, "args": {"name": "stream 20"}},
            {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 4242, "args": {"name": "python main"}}]
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n'
                  '"deviceProperties": [], "traceEvents": [\n')
        for e in meta:
            out.write(json.dumps(e) + ",\n")
        first = True
        for e in events(kernels, seed):
            out.write(("" if first else ",\n") + json.dumps(e, separators=(", ", ": ")))
            first = False
        out.write('\n], "traceName": "%s", "baseTimeNanoseconds": 1700000000000000000}\n' % path.name)
    return path


def main() -> None:
    """Write a synthetic trace."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write(args.out, args.kernels, args.seed)
    print(f"{path}: {args.kernels} kernels, {3 * args.kernels} events, {path.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
