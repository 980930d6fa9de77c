"""Prefill/decode disaggregation: the KV store (shared memory and TCP), the router's index, outputs equal to
the colocated engine's, worker death under load, transfer timeouts."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time

import httpx
import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.disagg.offline import generate
from infragent.engine.disagg.router import DisaggConfig, DisaggEngine
from infragent.engine.disagg.store import KVPool, SharedStore, StoreIndex, StoreLayout
from infragent.engine.disagg.tcp_store import StoreServer, TCPStoreClient
from infragent.engine.kv_transfer import RECORD_HEADER, TransferTimeout
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams
from server_fixture import metric, process_server, sigterm_mid_stream, thread_server, tiny_config

LAYOUT = StoreLayout(num_blocks=8, block_size=4, num_layers=2, row=6, num_state_slots=3, state_shape=(2, 2, 3, 3))


def _exercise(store: KVPool | TCPStoreClient, reader: KVPool | TCPStoreClient) -> None:
    """Bulk rows, a packed record and a state go in through store and come back out through reader."""
    k, v = torch.randn(7, 6), torch.randn(7, 6)
    blocks = [5, 2]  # a request's store blocks: 7 rows = block 5 full, then 3 rows of block 2
    slots = torch.tensor([5 * 4 + i for i in range(4)] + [2 * 4 + i for i in range(3)])
    store.put_rows(1, k, v, slots)
    packed_k, packed_v = torch.randn(2, 6), torch.randn(2, 6)
    store.put((0, 2, 1), RECORD_HEADER.pack(0, 2, 1, 2) + packed_k.numpy().tobytes() + packed_v.numpy().tobytes())
    state = torch.randn(2, 2, 3, 3)
    store.put_state(1, state)
    got_k, got_v = reader.read(blocks, 7)
    assert got_k.shape == (2, 7, 6)
    torch.testing.assert_close(got_k[1], k, rtol=0, atol=0)
    torch.testing.assert_close(got_v[1], v, rtol=0, atol=0)
    torch.testing.assert_close(got_k[0, 5:7], packed_k, rtol=0, atol=0)  # block 2 offsets 1-2 = rows 5-6
    torch.testing.assert_close(got_v[0, 5:7], packed_v, rtol=0, atol=0)
    torch.testing.assert_close(reader.read_state(1), state, rtol=0, atol=0)


def test_shared_memory_store_is_seen_by_an_attached_client():
    owner = SharedStore(LAYOUT)
    client = SharedStore(LAYOUT, name=owner.address[1])
    try:
        _exercise(client, owner)
    finally:
        client.close()
        owner.close()


def test_tcp_store_round_trips_every_operation():
    server = StoreServer(LAYOUT)
    _, host, port, layout = server.address
    writer, reader = TCPStoreClient(host, port, layout), TCPStoreClient(host, port, layout)
    try:
        _exercise(writer, reader)
        torch.testing.assert_close(server.pool.read_state(1), reader.read_state(1))
    finally:
        writer.close()
        reader.close()
        server.close()


def test_index_hands_out_blocks_and_slots_and_refuses_when_full():
    index = StoreIndex(LAYOUT)
    a = index.allocate("a", 9, holder=0)  # 9 rows → 3 blocks of 4
    assert len(a.blocks) == 3 and a.state_slot is not None
    assert index.allocate("b", 21, holder=1) is None  # 6 blocks: only 5 left
    b = index.allocate("b", 20, holder=1)
    assert len(b.blocks) == 5 and not set(a.blocks) & set(b.blocks)
    assert index.held_by(1) == ["b"]
    index.free("a")
    index.free("a")  # a second free is a no-op
    assert len(index.free_blocks) == 3 and len(index.free_slots) == 2


def test_disagg_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="decode_workers: must be a positive integer"):
        DisaggConfig(decode_workers=0).check(EngineConfig())
    with pytest.raises(ConfigError, match="kv_store: 'nfs'"):
        DisaggConfig(kv_store="nfs").check(EngineConfig())
    with pytest.raises(ConfigError, match="does not combine with tensor_parallel_size"):
        DisaggConfig().check(EngineConfig(tensor_parallel_size=2))


def test_transfer_wait_times_out_on_a_stalled_store():
    class StalledStore:
        """A store whose writes never finish until released (a peer that stopped reading)."""
        block_size = 16

        def __init__(self) -> None:
            self.release = threading.Event()

        def put_rows(self, *args: object) -> None:
            self.release.wait(30)

    engine = LLMEngine(tiny_config(kv_transfer=True, kv_transfer_impl="bulk"))
    store = StalledStore()
    engine.attach_kv_store(store, timeout_s=0.2)
    engine.add_request(list(range(100, 130)), SamplingParams(max_tokens=1))
    with pytest.raises(TransferTimeout, match="did not reach the store within 0.2 s"):
        engine.step()
    assert not store.release.is_set()  # the store was still stalled: the step gave up, it did not wait it out
    store.release.set()
    engine.close()


# a one-token prompt, and one whose chunked prefill (64 tokens a step) ends in a one-token chunk: such rows run
# as decodes, and their KV must still be transferred
PROMPTS = [[5, 9, 200, 31, 7, 1000, 42] * (i + 1) for i in range(4)] + [[77], list(range(300, 365))]


@pytest.mark.parametrize("kv_store, mode, impl", [("shm", "layerwise", "bulk"), ("shm", "after_prefill", "serialize"),
                                                  ("tcp", "layerwise", "serialize")])
def test_disaggregated_outputs_equal_colocated(kv_store, mode, impl):
    config = tiny_config(kv_transfer_mode=mode, kv_transfer_impl=impl, max_num_batched_tokens=64)  # chunked prefill
    params = [SamplingParams(max_tokens=10, ignore_eos=True)] * 4 + [
        SamplingParams(max_tokens=10, temperature=0.9, seed=7, ignore_eos=True),  # the RNG state travels too
        SamplingParams(max_tokens=1, ignore_eos=True)]  # done at the first token
    out = generate(config, DisaggConfig(kv_store=kv_store, decode_workers=2), PROMPTS, params)
    reference = LLMEngine(tiny_config())
    seqs = [reference.add_request(p, sp) for p, sp in zip(PROMPTS, params)]
    while reference.has_unfinished():
        reference.step()
    assert [o.error for o in out] == [None] * len(PROMPTS)
    assert [o.text for o in out] == [s.text for s in seqs]
    assert [o.completion_tokens for o in out] == [len(s.output_token_ids) for s in seqs]
    assert [o.finish_reason for o in out] == [s.finish_reason for s in seqs]


def test_real_model_disaggregated_greedy_equals_colocated():
    config = EngineConfig(model="llama", num_threads=1, kv_cache_gb=0.1, max_model_len=512)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are"]
    params = SamplingParams(max_tokens=12)
    out = generate(config, DisaggConfig(), prompts, params)
    reference = LLMEngine(config)
    seqs = [reference.add_request(p, params) for p in prompts]
    while reference.has_unfinished():
        reference.step()
    assert [o.text for o in out] == [s.text for s in seqs]
    assert all(o.completion_tokens > 0 for o in out)


def test_a_decode_worker_killed_under_load_fails_only_its_requests():
    disagg = DisaggConfig(decode_workers=2, transfer_timeout_s=20)
    with thread_server(disagg=disagg, max_num_seqs=8) as url:
        results: dict[int, tuple[int, str]] = {}

        def ask(i: int) -> None:
            body = {"prompt": [11 + i, 12, 13, 14, 15], "max_tokens": 200, "ignore_eos": True}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            results[i] = (r.status_code, r.text)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        victim = _decode_worker_pid(url)
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(90)
        codes = sorted(code for code, _ in results.values())
        assert len(results) == 8
        failed = [text for code, text in results.values() if code != 200]
        assert failed and all("died" in text and f"pid {victim}" in text for text in failed), results
        assert codes.count(200) >= 1  # the other decode worker's requests completed
        assert httpx.get(f"{url}/health").status_code == 200
        assert metric(url, "infragent:disagg_worker_deaths_total", 'role="decode"') == 1
        assert metric(url, "infragent:disagg_workers_alive", 'role="decode"') == 1
        assert metric(url, "infragent:disagg_request_failures_total", 'cause="worker_died"') == len(failed)
        after = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60)
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4


def _decode_worker_pid(url: str) -> int:
    """The pid of a decode worker holding requests, once it has streamed some tokens."""
    engine = _ENGINES[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = [f.worker for f in list(engine._flights.values()) if f.stage == "decode" and f.completion_tokens > 2]
        if held:
            return held[0].process.pid
        time.sleep(0.05)
    raise AssertionError("no decode worker started streaming")


_ENGINES: list[DisaggEngine] = []
_init = DisaggEngine.__init__


@pytest.fixture(autouse=True)
def _remember_engines(monkeypatch):
    def init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        _ENGINES.append(self)
    monkeypatch.setattr(DisaggEngine, "__init__", init)
    yield
    _ENGINES.clear()


def test_a_dead_prefill_worker_fails_new_requests_clearly():
    async def run() -> list:
        engine = DisaggEngine(tiny_config(), DisaggConfig())
        engine.start(asyncio.get_running_loop())
        try:
            prefill = next(w for w in engine.workers if w.role == "prefill")
            prefill.process.kill()
            prefill.process.join(10)
            await _until(lambda: not engine.is_alive())  # the router has seen the death
            alive = engine.is_alive()
            out = await engine.submit([1, 2, 3], SamplingParams(max_tokens=3)).collect()
            return [alive, out]
        finally:
            engine.shutdown()

    alive, out = asyncio.run(run())
    assert alive is False
    assert out.error is not None and "no prefill worker is alive" in out.error


def test_a_stalled_worker_fails_its_requests_at_the_transfer_timeout_and_serving_goes_on():
    async def run() -> dict:
        engine = DisaggEngine(tiny_config(), DisaggConfig(transfer_timeout_s=2.0))
        engine.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=400, ignore_eos=True)
        prefill, decode = (next(w for w in engine.workers if w.role == role) for role in ("prefill", "decode"))
        try:
            os.kill(prefill.process.pid, signal.SIGSTOP)  # stuck in prefill
            stuck_prefill = await engine.submit([1, 2, 3], params).collect()
            os.kill(prefill.process.pid, signal.SIGCONT)
            stream = engine.submit([4, 5, 6], params)
            first = await stream.queue.get()  # decoding has started
            os.kill(decode.process.pid, signal.SIGSTOP)  # stuck between tokens
            stuck_decode = await stream.collect()
            os.kill(decode.process.pid, signal.SIGCONT)
            after = await engine.submit([7, 8, 9], SamplingParams(max_tokens=5)).collect()
            await _until(lambda: len(engine.index.free_blocks) == engine.index.layout.num_blocks)  # once "dropped"
            return dict(stuck_prefill=stuck_prefill, first=first, stuck_decode=stuck_decode, after=after,
                        free=len(engine.index.free_blocks), total=engine.index.layout.num_blocks)
        finally:
            for w in (prefill, decode):
                os.kill(w.process.pid, signal.SIGCONT)
            engine.shutdown()

    out = asyncio.run(run())
    assert "prefill and KV transfer did not finish within transfer_timeout_s=2 s" in out["stuck_prefill"].error
    assert out["first"].error is None
    assert "no token came within transfer_timeout_s=2 s (decode worker" in out["stuck_decode"].error
    assert out["after"].error is None and out["after"].completion_tokens == 5
    assert out["free"] == out["total"]


def test_the_store_falls_back_to_tcp_when_shared_memory_is_too_small(monkeypatch):
    from infragent.engine.disagg import processes

    monkeypatch.setattr(processes, "shm_free_bytes", lambda: 1 << 20)  # a 1 MB /dev/shm, as in a bare container
    out = generate(tiny_config(), DisaggConfig(kv_store="shm"), [[5, 6, 7]], SamplingParams(max_tokens=4))
    assert out[0].error is None and out[0].completion_tokens == 4
    assert _ENGINES[-1].store.address[0] == "tcp"


def test_serve_disagg_from_the_command_line_streams_then_exits_cleanly_on_sigterm():
    with process_server("--disagg", "--decode-workers", "2", "--shutdown-timeout", "20") as (url, proc):
        pids = []
        while len(pids) < 3:  # the router logs each worker as it becomes ready, before uvicorn starts
            found = re.search(r"worker \d \(pid (\d+)\) ready", proc.stdout.readline())
            if found:
                pids.append(int(found.group(1)))
        assert metric(url, "infragent:disagg_workers_alive", 'role="decode"') == 2
        lines = sigterm_mid_stream(url, proc)  # the in-flight request finishes, then the workers stop
        assert proc.wait(30) == 0
        assert any('"finish_reason":"length"' in line.replace(" ", "") for line in lines), lines[-3:]
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if _running(pid)] == []


async def _until(condition, timeout_s: float = 30.0) -> bool:  # noqa: ANN001 - a no-argument predicate
    """Wait on the event loop until condition() holds (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _running(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False
