"""The census counts threads that want a CPU at once while they run, so threads a workload starts and joins
inside the window are still counted when the window ends."""
from __future__ import annotations

import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

from infragent.probes.contention import ContentionWatch
from infragent.probes.thread_census import ThreadCensus, runnable_threads


def _three_native_threads(seconds: float) -> None:
    """Three threads multiplying matrices in BLAS (one BLAS thread each, the GIL released) for about seconds."""
    def work() -> None:
        a = np.random.default_rng(0).random((256, 256))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            a @ a

    with threadpool_limits(1, user_api="blas"):
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def test_runnable_threads_reads_this_process() -> None:
    count = runnable_threads()
    assert count is not None and count >= 1  # the caller itself is running


def test_the_census_sees_three_busy_threads_at_once() -> None:
    census = ThreadCensus(every_s=0.02).start()
    _three_native_threads(0.8)
    census.stop()
    assert len(census.samples) >= 10, census.samples
    assert census.peak() >= 3, census.samples


def test_a_watch_with_a_census_counts_threads_that_ended_before_the_reading() -> None:
    watch = ContentionWatch()
    watch.count_threads()
    _three_native_threads(0.8)
    watch.close()
    reading = watch.now()
    assert reading.threads_running is not None and reading.threads_running >= 3, watch.census.samples
    plain = ContentionWatch()
    _three_native_threads(0.3)
    assert (plain.now().threads_running or 0) < 3  # without a census they are gone by the reading
