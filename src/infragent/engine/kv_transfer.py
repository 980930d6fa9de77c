"""KV transfer for disaggregated serving: each prefill layer's new K/V rows go to a KV-cache store on a
transfer thread, layer by layer (mode "layerwise", so the transfer can overlap the next layers' compute) or
all at once when the step's forward is done ("after_prefill").

The engine thread hands over a snapshot of the rows it just wrote (publish); the thread named
"kv-transfer" stores them; a prefill step ends only when its layers have landed (wait). Two store
clients: "serialize" packs block by block (header, K bytes, V bytes, CRC) in Python, holding the GIL, so it
runs only while the engine thread does not hold it — whether it overlaps compute depends on whether
compute releases the GIL (see native_gemm.py); "bulk" copies a layer's rows into the store's paged pool
with one native index_copy_ per tensor, which releases the GIL.
"""
from __future__ import annotations

import queue
import struct
import threading
import zlib

import torch

from infragent.trace import span

_HEADER = struct.Struct("<iiii")  # layer, block, first offset, rows
TRANSFER_MODES = ("layerwise", "after_prefill")
TRANSFER_IMPLS = ("serialize", "bulk")


class KVStore:
    """The store a decode worker reads from: (layer, block, first offset) → packed K/V rows with a CRC, or
    (bulk) rows in a paged pool per layer, [num_blocks * block_size, kv_heads * head_dim] for K and for V."""

    def __init__(self, block_size: int = 16, num_slots: int = 0) -> None:
        self._blobs: dict[tuple[int, int, int], tuple[int, bytes]] = {}
        self._lock = threading.Lock()
        self.bytes_stored = 0
        self.block_size, self.num_slots = block_size, num_slots
        self._pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer → (K pool, V pool)
        self._rows: dict[tuple[int, int, int], int] = {}  # bulk records: key → rows

    def put_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
                 keys: list[tuple[int, int]]) -> None:
        """Bulk: rows k, v [T, row] into the layer's pool at flat cache slots; keys are (block, first offset,
        rows) runs for get()."""
        pools = self._pools.get(layer)
        if pools is None:
            pools = self._pools[layer] = (torch.zeros(self.num_slots, k.shape[1], dtype=k.dtype),
                                          torch.zeros(self.num_slots, v.shape[1], dtype=v.dtype))
        pools[0].index_copy_(0, slots, k)  # one native copy each: the GIL is released while it runs
        pools[1].index_copy_(0, slots, v)
        with self._lock:
            for block, first, rows in keys:
                self._rows[(layer, block, first)] = rows
            self.bytes_stored += k.nbytes + v.nbytes

    def put(self, key: tuple[int, int, int], payload: bytes) -> None:
        """Store one packed block slice."""
        crc = zlib.crc32(payload)
        with self._lock:
            self._blobs[key] = (crc, payload)
            self.bytes_stored += len(payload)

    def get(self, key: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One block slice as (K rows, V rows) [rows, kv_heads * head_dim]; a packed one's CRC is checked."""
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                layer, block, first = key
                start = block * self.block_size + first
                k_pool, v_pool = self._pools[layer]
                return k_pool[start:start + rows].clone(), v_pool[start:start + rows].clone()
            crc, payload = self._blobs[key]
        if zlib.crc32(payload) != crc:
            raise ValueError(f"KV store: block {key} is corrupt (CRC mismatch)")
        _, _, _, rows = _HEADER.unpack_from(payload)
        body = torch.frombuffer(bytearray(payload[_HEADER.size:]), dtype=torch.float32)
        k, v = body.view(2, rows, -1)
        return k, v

    def keys(self) -> list[tuple[int, int, int]]:
        """Every stored (layer, block, first offset)."""
        with self._lock:
            return list(self._blobs) + list(self._rows)

    def __len__(self) -> int:
        return len(self._blobs) + len(self._rows)


class KVTransfer:
    """The transfer thread and its queue; one per engine."""

    def __init__(self, store: KVStore, impl: str = "serialize") -> None:
        self.store = store
        self.impl = impl
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
        if self.impl == "bulk":
            self._send_bulk(layer, k, v, blocks, offsets)
            return
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

    def _send_bulk(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                   offsets: torch.Tensor) -> None:
        """The whole layer in two native copies; the records (runs of one block) are computed vectorized."""
        with span("kv.transfer", layer=layer, rows=k.shape[0]):
            starts = torch.ones(len(blocks), dtype=torch.bool)
            starts[1:] = blocks[1:] != blocks[:-1]
            first = starts.nonzero().flatten()
            counts = torch.diff(torch.cat([first, torch.tensor([len(blocks)])]))
            runs = list(zip(blocks[first].tolist(), offsets[first].tolist(), counts.tolist()))
            self.store.put_rows(layer, k, v, blocks * self.store.block_size + offsets, runs)
