"""Faults end to end on a served expert-parallel engine: one EP rank killed under load fails the requests in
flight with an error that names the rank, at once (no collective waits out its timeout, whichever exchange
carries dispatch/combine); the server stays up and says why it cannot serve; it then shuts down cleanly with
no rank left behind."""
from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time

import httpx
import psutil
import pytest

from server_fixture import process_server

PROMPT = "Tell me a long story about a lighthouse keeper and the ships that pass"


def stream_completion(url: str, decoding: threading.Event) -> dict:
    """One streaming completion: the tokens it got and the error event that ended it (if one did); sets
    decoding once its third token is in."""
    body = {"model": "hybrid-moe", "prompt": PROMPT, "max_tokens": 400, "stream": True, "ignore_eos": True}
    tokens, error, start = 0, None, time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            return {"tokens": 0, "error": response.read().decode(), "seconds": time.monotonic() - start}
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                error = event["error"]["message"]
            else:
                tokens += 1
                if tokens == 3:
                    decoding.set()
    return {"tokens": tokens, "error": error, "seconds": time.monotonic() - start}


def rank_processes(server: psutil.Process) -> list[psutil.Process]:
    """The server's spawned processes, at any depth (see rank_processes_of)."""
    return rank_processes_of(server, recursive=True)


def rank_processes_of(parent: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
    """parent's spawned children: those that run multiprocessing's entry point, not its resource tracker."""
    ranks = []
    for child in parent.children(recursive=recursive):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            ranks.append(child)
    return ranks


@pytest.mark.parametrize("exchange", ["native", "gloo"])
def test_a_killed_expert_parallel_rank_fails_its_requests_by_name_and_leaves_nothing_hanging(exchange: str) -> None:
    with process_server("--model", "hybrid-moe", "--ep", "2", "--moe-exchange", exchange,
                        "--max-num-seqs", "4") as (url, proc):
        server = psutil.Process(proc.pid)
        ranks = rank_processes(server)
        assert len(ranks) == 1, [r.cmdline() for r in ranks]  # EP=2: rank 0 is the server, rank 1 its child
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            decoding = threading.Event()
            streams = [pool.submit(stream_completion, url, decoding) for _ in range(4)]
            assert decoding.wait(60), "no tokens within 60 s"
            killed_at = time.monotonic()
            ranks[0].send_signal(signal.SIGKILL)
            outcomes = [s.result(timeout=120) for s in streams]
        for outcome in outcomes:
            assert outcome["error"] is not None and "rank" in outcome["error"], outcome
            assert str(ranks[0].pid) in outcome["error"], outcome  # the rank named by its pid
        assert time.monotonic() - killed_at < 30  # failed at once, not after a collective's timeout
        assert httpx.get(f"{url}/health", timeout=5).status_code == 503  # up, and says it cannot serve
        refused = httpx.post(f"{url}/v1/completions", json={"model": "hybrid-moe", "prompt": "hi", "max_tokens": 4},
                             timeout=30)
        assert refused.status_code == 503 and str(ranks[0].pid) in refused.text, refused.text
        children = server.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)  # a clean shutdown, in time
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]  # nothing left behind



def test_under_disaggregation_a_prefill_worker_that_lost_a_rank_leaves_and_the_others_keep_serving() -> None:
    with process_server("--model", "hybrid-moe", "--ep", "2", "--moe-exchange", "native", "--disagg",
                        "--prefill-workers", "2", "--max-num-seqs", "4") as (url, proc):
        server = psutil.Process(proc.pid)
        workers = sorted(rank_processes_of(server), key=lambda p: p.create_time())
        assert len(workers) == 3  # prefill 0, prefill 1, decode 0: each with an EP rank of its own
        prefill_rank = rank_processes_of(workers[0])
        assert len(prefill_rank) == 1 and all(len(rank_processes_of(w)) == 1 for w in workers)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            decoding = threading.Event()
            streams = [pool.submit(stream_completion, url, decoding) for _ in range(4)]
            assert decoding.wait(60), "no tokens within 60 s"
            prefill_rank[0].send_signal(signal.SIGKILL)
            [s.result(timeout=120) for s in streams]  # in decode already: they may finish or not
            # the worker finds out at its next step: the requests it takes then fail, naming it and the rank
            probes = [pool.submit(stream_completion, url, threading.Event()) for _ in range(4)]
            failed = [o["error"] for o in (s.result(timeout=120) for s in probes) if o["error"] is not None]
            assert failed and all("prefill worker 0" in e and str(prefill_rank[0].pid) in e for e in failed), failed
            psutil.wait_procs([workers[0]], timeout=30)
            assert not workers[0].is_running()  # the worker left; the router routes around it
            after = [pool.submit(stream_completion, url, threading.Event()) for _ in range(4)]
            outcomes = [s.result(timeout=120) for s in after]
        assert all(o["error"] is None and o["tokens"] > 0 for o in outcomes), outcomes  # served by the others
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
