"""Contention by source: other processes, the hypervisor, or the workload's own thread pools beyond the cores,
each with its remedy and a next probe."""
from __future__ import annotations

import re

import torch

import bench_cases
from infragent.probes.bench import run_bench
from infragent.probes.contention import Contention
from infragent.probes.pools import ThreadPool, thread_pools


def test_each_source_is_named_with_its_remedy() -> None:
    blas = (ThreadPool("blas", "openblas", 2),)
    own = Contention(0.45, 0.0, 0.01, 2.0, threads_running=8, cores=2, pools=blas)
    assert own.source == "self" and own.contended
    assert own.why.startswith("self-contended: 8 threads of BLAS on 2 cores (BLAS (openblas) 2 threads each")
    assert "other processes used 0.01 cores" in own.why
    assert "threadpool_limits(1, user_api='blas')" in own.remedy and "OPENBLAS_NUM_THREADS=1" in own.remedy
    others = Contention(0.45, 0.0, 1.2, 2.0, threads_running=8, cores=2, pools=blas)
    assert others.source == "others" and "contended by other processes: they used 1.2 cores" in others.why
    torch_pool = Contention(0.3, 0.0, 0.0, 2.0, threads_running=4, cores=2, pools=(ThreadPool("torch", "intra-op", 2),))
    assert "torch.set_num_threads(1)" in torch_pool.remedy
    bare = Contention(0.3, 0.0, 0.0, 2.0, threads_running=3, cores=2)
    assert bare.why.startswith("self-contended: 3 threads of this process on 2 cores") and "at most 2" in bare.remedy
    busy = Contention(0.3, 0.0, 0.0, 2.0, threads_running=1, cores=2, cores_used=1.9, pools=blas)  # exited threads
    assert busy.why.startswith("self-contended: more threads of BLAS than fit on 2 cores") and "1.9 cores' worth" in busy.why
    fitting = Contention(0.3, 0.0, 0.0, 2.0, threads_running=2, cores=2, cores_used=0.5)  # waits, not from ours
    assert fitting.source == "" and "waited for a CPU" in fitting.why and fitting.remedy == ""


def test_an_oversubscribed_numpy_workload_is_self_contended_with_the_fix_and_a_next_probe() -> None:
    import numpy  # noqa: F401 (its BLAS pool is what the workload oversubscribes)

    fb = run_bench(bench_cases.oversubscribed, budget_s=3.0)
    contention = fb.details["contention"]
    if contention["others_cores"] is not None and contention["others_cores"] > 0.25:
        assert contention["source"] == "others" and "contended by other processes" in fb.finding  # a loaded machine
        return
    assert contention["source"] == "self", contention
    assert "self-contended:" in fb.finding and f" on {contention['cores']} cores (" in fb.finding, fb.finding
    if any(p.kind == "blas" for p in thread_pools()):
        assert "threadpool_limits" in fb.next_probes[0], fb.next_probes
        counted = re.search(r"self-contended: (\d+) threads of BLAS on (\d+) cores", fb.finding)
        assert counted and int(counted.group(1)) > int(counted.group(2)), fb.finding  # counted while they ran
        assert "torch" not in fb.finding and "set_num_threads" not in fb.next_probes[0]  # numpy code: no torch
    assert fb.next_probes[0].startswith("bench again after capping the workload's own thread pools")


def test_the_libraries_a_workload_reaches_are_read_from_its_code() -> None:
    from infragent.probes.workload_libraries import libraries

    assert "numpy" in libraries(bench_cases.oversubscribed) and "torch" not in libraries(bench_cases.oversubscribed)
    layer = torch.nn.Linear(4, 4)

    class Engine:
        def step(self) -> torch.Tensor:
            return layer(torch.ones(4))

    engine = Engine()
    assert "torch" in libraries(lambda: engine.step())  # through an object's method
    assert "torch" in libraries(lambda: layer(torch.ones(4)))
    assert libraries(lambda: engine.step(), limit=2) is None  # a walk cut short: unknown, nothing left out
