"""KV transfer for disaggregated serving: each prefill layer's new K/V rows go to a KV-cache store on a
transfer thread, layer by layer, so the transfer can overlap the next layers' compute.

The engine thread hands over a snapshot of the rows it just wrote (publish); the thread named
"kv-transfer" packs them block by block (header, K bytes, V bytes, CRC) into the store; a prefill step
ends only when its layers have landed (wait). The packing is Python and holds the GIL, so the thread
runs only while the engine thread is not holding it: whether the transfer overlaps compute depends on
whether compute releases the GIL (see native_gemm.py).
"""
from __future__ import annotations

import queue
import struct
import threading
import zlib

import torch

from infragent.trace import span

_HEADER = struct.Struct("<iiii")  # layer, block, first offset, rows


class KVStore:
    """The store a decode worker reads from: (layer, block, first offset) → packed K/V rows with a CRC."""

    def __init__(self) -> None:
        self._blobs: dict[tuple[int, int, int], tuple[int, bytes]] = {}
        self._lock = threading.Lock()
        self.bytes_stored = 0

    def put(self, key: tuple[int, int, int], payload: bytes) -> None:
        """Store one packed block slice."""
        crc = zlib.crc32(payload)
        with self._lock:
            self._blobs[key] = (crc, payload)
            self.bytes_stored += len(payload)

    def get(self, key: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpack one block slice into (K rows, V rows) as [rows, kv_heads * head_dim]; checks the CRC."""
        with self._lock:
            crc, payload = self._blobs[key]
        if zlib.crc32(payload) != crc:
            raise ValueError(f"KV store: block {key} is corrupt (CRC mismatch)")
        _, _, _, rows = _HEADER.unpack_from(payload)
        body = torch.frombuffer(bytearray(payload[_HEADER.size:]), dtype=torch.float32)
        k, v = body.view(2, rows, -1)
        return k, v

    def __len__(self) -> int:
        return len(self._blobs)


class KVTransfer:
    """The transfer thread and its queue; one per engine."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kv-transfer", daemon=True)
        self._thread.start()

    def publish(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                offsets: torch.Tensor) -> None:
        """Queue a layer's freshly written rows (k, v: [T, kv_heads, head_dim]) with their cache slots."""
        self._queue.put((layer, k.reshape(k.shape[0], -1).clone(), v.reshape(v.shape[0], -1).clone(),
                         blocks.clone(), offsets.clone()))

    def wait(self) -> None:
        """Block until every published layer is in the store."""
        with span("kv.transfer.wait"):
            self._queue.join()

    def close(self) -> None:
        """Drain the queue and stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._send(*item)
            finally:
                self._queue.task_done()

    def _send(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
              offsets: torch.Tensor) -> None:
        keys, values, block_ids, slots = k.numpy(), v.numpy(), blocks.tolist(), offsets.tolist()
        first = 0
        while first < len(block_ids):  # rows of one block are consecutive: pack each run as one record
            last = first
            while last + 1 < len(block_ids) and block_ids[last + 1] == block_ids[first]:
                last += 1
            with span("kv.transfer", layer=layer, block=block_ids[first], rows=last - first + 1):
                payload = (_HEADER.pack(layer, block_ids[first], slots[first], last - first + 1)
                           + keys[first:last + 1].tobytes() + values[first:last + 1].tobytes())
                self.store.put((layer, block_ids[first], slots[first]), payload)
            first = last + 1
