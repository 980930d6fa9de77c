"""The gil probe's answer for a workload that records no spans: whole threads (analysis/gil_threads.py),
the starved one judged on the interval of its GIL-wait share, the holder named with the function it held
the GIL in (py-spy), and a hint that follows whichever of GIL wait, run-queue wait and blocking dominates.
"""
from __future__ import annotations

from typing import Any

from infragent.analysis.gil_shares import HeldSamples
from infragent.analysis.gil_threads import ThreadShares, thread_shares
from infragent.probes.feedback import Evidence, Feedback, Measure
from infragent.trace_model import Trace

SHOWN_THREADS = 4  # threads with numbers in the reply (all of them are in the details)
UNSEEN_LIMIT = 0.2  # a thread off CPU this share of its life with no state sample leaves a pass unfounded


def threads_feedback(workload: str, trace: Trace, held: dict[int, HeldSamples] | None,
                     states: list[tuple[int, int, str]], threshold: float, notes: list[str],
                     evidence: list[Evidence], skip: set[str]) -> Feedback:
    """The verdict over whole threads: fail when a thread's GIL-wait interval lies above threshold, pass
    when every thread's lies below it, inconclusive when one straddles it."""
    rows = thread_shares(trace, held, states, skip)
    details: dict[str, Any] = {"threads": [r.to_dict() for r in rows], "threshold": threshold, "notes": notes,
                               "attribution": "whole threads (no spans recorded)"}
    if not rows:
        return Feedback("gil", "inconclusive", "no thread lived long enough to be sampled (the workload took "
                        "under two sampling intervals)", evidence=evidence, details=details,
                        next_probes=["make the workload run for a second or more"])
    worst = rows[0]
    lo, hi = worst.interval()
    holder = _holder(rows, worst)
    native = max(rows, key=lambda r: r.share("native_wait"))
    not_gil = ""
    if native.share("native_wait") > threshold:  # long futex waits that no GIL holder covers
        not_gil = (f"; {native.thread} waited {native.share('native_wait') + native.share('gil_wait'):.0%} of its "
                   f"time on futexes while the other threads held the GIL only "
                   f"{(native.others_held_ns or 0) / native.wall_ns:.0%} of it: that cannot be the GIL, it is a "
                   "native wait (a BLAS or OpenMP pool's synchronization, or a native lock)")
    numbers = _numbers(rows)
    held_text = ""
    if holder is not None and holder.held_ns is not None:
        where = f", mostly in {holder.function}" if holder.function else ""
        held_text = f"; thread {holder.thread} held the GIL {holder.share('held'):.0%} of its time{where}"
    elif holder is not None:
        held_text = f"; thread {holder.thread} was on CPU {holder.share('cpu'):.0%} of its time (held: n/a without py-spy)"
    elif all(r.held_ns is not None for r in rows):
        most = max(r.share("held") for r in rows)
        held_text = f"; no thread held the GIL more than {max(most, 0.0):.0%} of its time"
    held_text += not_gil
    split = (f"GIL wait {worst.share('gil_wait'):.0%} [{lo:.0%}, {hi:.0%}], run queue "
             f"{worst.share('run_queue'):.0%}, blocked on locks/sleep/I/O {worst.share('blocked'):.0%}, on CPU "
             f"{worst.share('cpu'):.0%} of its time over {len(worst.windows)} windows")
    locality: dict[str, Any] = {"thread": worst.thread, "attribution": "whole threads (no spans)"}
    if holder is not None:
        locality.update(holder=holder.thread, holder_function=holder.function)
    suffix = f" [{'; '.join(notes)}]" if notes else ""
    if lo > threshold:
        finding = f"thread {worst.thread} is starved of the GIL: {split}{held_text}{suffix}"
        return Feedback("gil", "fail", finding, numbers, {**locality, "dominant": "gil_wait"}, evidence,
                        _gil_fix(workload, worst, holder), details)
    unseen = [r for r in rows if r.share("unseen") > UNSEEN_LIMIT]
    if hi < threshold and unseen:
        blind = ", ".join(f"{r.thread} {r.share('unseen'):.0%}" for r in unseen)
        finding = (f"inconclusive: the thread-state sampler never saw some threads asleep while they were off CPU "
                   f"({blind} of their time), so their GIL wait cannot be told from blocking: {split}{suffix}")
        return Feedback("gil", "inconclusive", finding, numbers, locality, evidence,
                        [f"rerun gil on {workload} (on a busy machine the sampler can miss a short workload)"],
                        details)
    if hi < threshold and not_gil:
        finding = (f"no GIL starvation: no thread waits for the GIL more than {threshold:.0%} of its time (most: "
                   f"{worst.thread}, {split}){held_text}{suffix}")
        return Feedback("gil", "pass", finding, numbers, {**locality, "dominant": "native_wait"}, evidence,
                        [f"{native.thread} waits on its native thread pool, not the GIL: cap the pools the workload "
                         "nests in its threads (threadpoolctl.threadpool_limits(1) around the threaded code, or "
                         "OPENBLAS_NUM_THREADS=1 / OMP_NUM_THREADS=1; torch.set_num_threads(1) for torch ops), "
                         f"then bench {workload} again"], details)
    if hi < threshold:
        cause = worst.dominant()
        finding = (f"no GIL starvation: no thread waits for the GIL more than {threshold:.0%} of its time (most: "
                   f"{worst.thread}, {split}){held_text}{suffix}")
        return Feedback("gil", "pass", finding, numbers, {**locality, "dominant": cause}, evidence,
                        _other_fix(workload, worst, cause), details)
    finding = (f"inconclusive: thread {worst.thread}'s GIL wait is near the {threshold:.0%} threshold: {split}"
               f"{held_text}{suffix}")
    return Feedback("gil", "inconclusive", finding, numbers, locality, evidence,
                    [f"rerun gil on {workload} with a longer workload (more windows narrow the interval)"], details)


HOLDER_SHARE = 0.05  # a thread that held the GIL less than this share of its time is no holder


def _holder(rows: list[ThreadShares], worst: ThreadShares) -> ThreadShares | None:
    """The thread that held the GIL most (py-spy), none when no thread held it HOLDER_SHARE of its time;
    without py-spy the busiest on CPU."""
    others = [r for r in rows if r.tid != worst.tid] or rows
    if all(r.held_ns is not None for r in others):
        top = max(others, key=lambda r: r.held_ns or 0.0)
        return top if top.share("held") >= HOLDER_SHARE else None
    return max(others, key=lambda r: r.share("cpu"))


def _numbers(rows: list[ThreadShares]) -> dict[str, Measure]:
    numbers: dict[str, Measure] = {}
    for r in rows[:SHOWN_THREADS]:
        lo, hi = r.interval()
        numbers[f"{r.thread}.gil_wait"] = Measure(100 * r.share("gil_wait"), "%", 100 * lo, 100 * hi, len(r.windows))
        if r.held_ns is not None:
            numbers[f"{r.thread}.held"] = Measure(100 * r.share("held"), "%")
        numbers[f"{r.thread}.run_queue"] = Measure(100 * r.share("run_queue"), "%")
        numbers[f"{r.thread}.blocked"] = Measure(100 * r.share("blocked"), "%")
    return numbers


def _gil_fix(workload: str, worst: ThreadShares, holder: ThreadShares | None) -> list[str]:
    who = holder.thread if holder else "the holding thread"
    where = f" ({holder.function})" if holder and holder.function else ""
    return [f"move {who}'s per-item Python work{where} into torch ops that release the GIL, or into one "
            "batched call per step",
            f"rerun gil on {workload} to confirm {worst.thread} stops waiting"]


def _other_fix(workload: str, worst: ThreadShares, cause: str) -> list[str]:
    if cause == "run_queue" and worst.share("run_queue") > 0.1:
        return [f"{worst.thread} waits for a core, not the GIL: the machine is oversubscribed (other processes, "
                "or more busy threads than cores): cap the workload's thread pools (torch.set_num_threads for "
                "torch ops; threadpoolctl.threadpool_limits or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS for numpy "
                "and other BLAS/OpenMP users) or free cores"]
    if cause == "blocked" and worst.share("blocked") > 0.1:
        return [f"record {workload} to see what {worst.thread} blocks on (a lock, queue, sleep or I/O)"]
    return [f"record {workload} (where the time goes, if not the GIL)"]
