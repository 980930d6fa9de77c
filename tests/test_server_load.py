"""The server under load: 500 requests at concurrency 32, streaming and not, 10% of clients hanging up.

Afterwards nothing failed except intended 429s, no KV blocks or state slots are held, /metrics token counts
equal the usage the clients received, and the server's RSS is within 10% of its level before the load.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from server_fixture import metric, process_server

WORDS = "the cache of a model holds keys and values for every token it has seen so far in each layer".split()


@dataclass
class Outcome:
    kind: str  # ok | refused (429) | hung_up (the client left on purpose) | failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    detail: str = ""
    refusals: int = 0  # 429s this request got before the attempt that decided it


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def _one(client: httpx.AsyncClient, url: str, rng: random.Random) -> Outcome:
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    hang_up = rng.random() < 0.10
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))
    body: dict = {"max_tokens": 400 if hang_up else rng.randint(1, 24), "ignore_eos": hang_up,
                  "temperature": rng.choice([0.0, 0.8]), "seed": rng.randint(0, 1000)}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
        return await _streamed(client, url + path, body, hang_up, rng)
    try:
        response = await asyncio.wait_for(client.post(url + path, json=body), rng.uniform(0.05, 0.5) if hang_up else 120)
    except asyncio.TimeoutError:
        return Outcome("hung_up")
    return _judge(response.status_code, response.text, response.json().get("usage") if response.status_code == 200 else None)


async def _streamed(client: httpx.AsyncClient, url: str, body: dict, hang_up: bool, rng: random.Random) -> Outcome:
    leave_after = rng.randint(1, 3)
    used, finish, chunks = None, None, 0
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            return _judge(response.status_code, (await response.aread()).decode(), None)
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks += 1
            if hang_up and chunks >= leave_after:
                return Outcome("hung_up")
            if chunk.get("usage"):
                used = chunk["usage"]
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
    if finish is None or used is None:
        return Outcome("failed", detail=f"stream ended without finish_reason/usage ({chunks} chunks)")
    return _judge(200, "", used)


def _judge(status: int, text: str, used: dict | None) -> Outcome:
    if status == 429:
        return Outcome("refused")
    if status != 200 or used is None:
        return Outcome("failed", detail=f"{status}: {text[:200]}")
    return Outcome("ok", used["prompt_tokens"], used["completion_tokens"])


async def _load(url: str, n: int, concurrency: int, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def bounded(i: int) -> Outcome:
            async with gate:
                request_rng = random.Random(rng.random() + i)
                refusals = 0
                while True:  # like the openai client: back off and retry on 429
                    try:
                        outcome = await _one(client, url, random.Random(request_rng.random()))
                    except Exception as err:  # a transport error is a failure of the server
                        return Outcome("failed", detail=repr(err))
                    if outcome.kind != "refused" or refusals >= 100:
                        outcome.refusals = refusals
                        return outcome
                    refusals += 1
                    await asyncio.sleep(0.1)
        return await asyncio.gather(*[bounded(i) for i in range(n)])


def _wait_idle(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(metric(url, name) == 0 for name in ("infragent:num_requests_running", "infragent:num_requests_waiting",
                                                   "infragent:kv_blocks_used", "infragent:state_slots_used")):
            return
        time.sleep(0.1)
    raise AssertionError("after the load the server still holds requests, KV blocks or state slots")


def test_500_requests_at_concurrency_32_with_hang_ups():
    with process_server("--max-num-seqs", "24", "--max-waiting", "4") as (url, proc):
        warm = asyncio.run(_load(url, 40, 8, seed=1))  # first use allocates workspaces; RSS is measured after it
        _wait_idle(url)
        rss_before = _rss_bytes(proc.pid)
        outcomes = asyncio.run(_load(url, 500, 32, seed=2))
        _wait_idle(url)
        rss_after = _rss_bytes(proc.pid)
        kinds = {k: sum(o.kind == k for o in outcomes) for k in ("ok", "refused", "hung_up", "failed")}
        failed = [o.detail for o in warm + outcomes if o.kind == "failed"]
        assert not failed, f"{len(failed)} failed: {failed[:3]}"
        assert kinds["ok"] + kinds["hung_up"] == 500 and kinds["hung_up"] > 20, kinds
        completed = [o for o in warm + outcomes if o.kind == "ok"]
        assert metric(url, "infragent:prompt_tokens_total", 'outcome="delivered"') == sum(o.prompt_tokens for o in completed)
        assert metric(url, "infragent:generation_tokens_total", 'outcome="delivered"') == sum(
            o.completion_tokens for o in completed)
        refusals = sum(o.refusals for o in warm + outcomes)
        assert refusals > 0  # the bounded queue was exercised
        rejected = metric(url, "infragent:requests_total", 'status="rejected"')
        # A client that hangs up may leave before reading its 429: the server counts it, the client cannot.
        assert refusals <= rejected <= refusals + kinds["hung_up"]
        assert rss_after <= 1.10 * rss_before, f"RSS grew from {rss_before / 1e6:.0f} MB to {rss_after / 1e6:.0f} MB"
