"""The load client against a server that closes kept-alive connections while they sit idle (uvicorn does after
5 s): the next request on such a connection is sent again on a new one, never recorded as a failure."""
from __future__ import annotations

import asyncio

from infragent.analysis.serving_metrics import RequestRecord
from infragent.probes.load_client import ConnectionPool, now_clock, stream_request

ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
          + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (b'data: {"choices": [{"text": "hi"}]}\n\n',
                                                              b"data: [DONE]\n\n")) + b"0\r\n\r\n")


async def _serve(answers_per_connection: int) -> tuple[asyncio.Server, list[int]]:
    """A server that answers this many requests on a connection, then closes it without a word (0: closes at
    once); and the count of requests it read."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(answers_per_connection):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            seen.append(1)
            writer.write(ANSWER)
            await writer.drain()
        await asyncio.sleep(0.05)  # idle, then the server's keep-alive timeout closes the connection
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


async def _requests(answers_per_connection: int, count: int) -> tuple[list[RequestRecord], int]:
    server, seen = await _serve(answers_per_connection)
    pool = ConnectionPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    records = []
    for i in range(count):
        record = RequestRecord(i, 4, 1)
        await stream_request(pool, "/v1/completions", {"prompt": "x", "stream": True}, record, now_clock())
        records.append(record)
        await asyncio.sleep(0.01 if i % 2 == 0 else 0.2)  # every other gap is longer than the server keeps idle
    pool.close()
    server.close()
    return records, len(seen)


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed():
    records, served = asyncio.run(_requests(answers_per_connection=1, count=6))
    assert all(r.success and r.ttft_s > 0 for r in records), [r.error for r in records]
    assert served == 6  # each request reached the server once


def test_a_new_connection_that_fails_is_a_failure_not_a_retry_loop():
    records, served = asyncio.run(_requests(answers_per_connection=0, count=2))
    assert served == 0 and not any(r.success for r in records)
    assert all("bytes read" in r.error or "reset" in r.error.lower() for r in records), [r.error for r in records]
