"""The store's TCP fallback: where a shared-memory segment cannot be made (or workers do not share a host),
the router serves the pool over a socket and each worker's client sends the same operations as messages.

A request is a header (op, a, body bytes) and a body; every reply is a length and its bytes (empty for a
put: the reply says the rows landed). Sockets block with a timeout, so a stalled peer fails the transfer
instead of hanging it; sendall/recv_into release the GIL while they wait.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading

import torch

from infragent.engine.disagg.store import KVPool, StoreLayout

_REQUEST = struct.Struct("<Bqq")  # op, argument (layer, slot or token count), body bytes
_REPLY = struct.Struct("<q")
PUT_ROWS, PUT, PUT_STATE, READ, READ_STATE = range(5)


class StoreServer:
    """The pool in the router's memory, served on host:port (port 0 picks a free one)."""

    def __init__(self, layout: StoreLayout, host: str = "127.0.0.1", port: int = 0) -> None:
        self.layout = layout
        self.pool = KVPool(layout, bytearray(layout.nbytes))
        pool = self.pool

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                while True:
                    try:
                        op, arg, size = _REQUEST.unpack(_recv(self.request, _REQUEST.size))
                        reply = _apply(pool, op, arg, _recv(self.request, size))
                    except (ConnectionError, OSError):
                        return
                    self.request.sendall(_REPLY.pack(len(reply)) + reply)

        self._server = socketserver.ThreadingTCPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kv-store-tcp", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple:
        """What a worker needs to connect: ("tcp", host, port, layout)."""
        host, port = self._server.server_address[:2]
        return ("tcp", host, port, self.layout)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


class TCPStoreClient:
    """KVPool's operations over one connection to a StoreServer (thread-safe: one request at a time)."""

    def __init__(self, host: str, port: int, layout: StoreLayout, timeout_s: float = 60.0) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()

    def put_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Bulk: the layer's rows and their slots in one message."""
        self._call(PUT_ROWS, layer, slots.to(torch.int64).numpy().tobytes() + k.numpy().tobytes()
                   + v.numpy().tobytes())

    def put(self, key: tuple[int, int, int], payload: bytes) -> None:
        """Serialize: one packed block record."""
        self._call(PUT, 0, payload)

    def put_state(self, slot: int, state: torch.Tensor) -> None:
        """A request's KDA states."""
        self._call(PUT_STATE, slot, state.contiguous().numpy().tobytes())

    def read(self, blocks: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) [layers, num_tokens, row] of a request's blocks."""
        body = self._call(READ, num_tokens, torch.tensor(blocks, dtype=torch.int64).numpy().tobytes())
        kv = torch.frombuffer(body, dtype=torch.float32).view(2, self.layout.num_layers, num_tokens, -1)
        return kv[0], kv[1]

    def read_state(self, slot: int) -> torch.Tensor:
        """A copy of one state slot."""
        return torch.frombuffer(self._call(READ_STATE, slot, b""), dtype=torch.float32).view(*self.layout.state_shape)

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def _call(self, op: int, arg: int, body: bytes) -> bytearray:
        with self._lock:
            self._sock.sendall(_REQUEST.pack(op, arg, len(body)) + body)
            (size,) = _REPLY.unpack(_recv(self._sock, _REPLY.size))
            return _recv(self._sock, size)


def _apply(pool: KVPool, op: int, arg: int, body: bytearray) -> bytes:
    """One request against the pool; the reply's bytes."""
    if op == PUT_ROWS:
        n = len(body) // (8 + 2 * 4 * pool.layout.row)
        slots = torch.frombuffer(body, dtype=torch.int64, count=n)
        rows = torch.frombuffer(body, dtype=torch.float32, offset=8 * n).view(2, n, pool.layout.row)
        pool.put_rows(arg, rows[0], rows[1], slots)
    elif op == PUT:
        pool.put((0, 0, 0), bytes(body))
    elif op == PUT_STATE:
        pool.put_state(arg, torch.frombuffer(body, dtype=torch.float32).view(*pool.layout.state_shape))
    elif op == READ:
        k, v = pool.read(torch.frombuffer(body, dtype=torch.int64).tolist(), arg)
        return torch.stack([k, v]).numpy().tobytes()
    elif op == READ_STATE:
        return pool.read_state(arg).numpy().tobytes()
    else:
        raise ConnectionError(f"KV store: unknown operation {op}")
    return b""


def _recv(sock: socket.socket, size: int) -> bytearray:
    """Exactly size bytes (ConnectionError when the peer closes first)."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("KV store: connection closed mid-message")
        got += n
    return buf
