"""KV transfer for disaggregated serving: each prefill layer's new K/V rows go to a KV-cache store on a
transfer thread, layer by layer (mode "layerwise", so the transfer can overlap the next layers' compute) or
all at once when the step's forward is done ("after_prefill").

The engine thread hands over a snapshot of the rows it just wrote (publish); the thread named
"kv-transfer" stores them; a prefill step ends only when its layers have landed (wait, with a timeout). A
store is anything with put_rows (bulk) and put (packed): the in-process KVStore below, or disaggregation's
shared-memory and TCP stores (engine/disagg/), whose blocks differ from the engine's: block_map translates. Two store
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

RECORD_HEADER = struct.Struct("<iiii")  # a packed record (serialize): layer, block, first offset, rows


class TransferError(RuntimeError):
    """Published KV did not reach the store."""


class TransferTimeout(TransferError):
    """Published KV did not land in the store in time."""


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

    def put_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Bulk: rows k, v [T, row] into the layer's pool at flat cache slots (block * block_size + offset)."""
        pools = self._pools.get(layer)
        if pools is None:
            pools = self._pools[layer] = (torch.zeros(self.num_slots, k.shape[1], dtype=k.dtype),
                                          torch.zeros(self.num_slots, v.shape[1], dtype=v.dtype))
        pools[0].index_copy_(0, slots, k)  # one native copy each: the GIL is released while it runs
        pools[1].index_copy_(0, slots, v)
        blocks, offsets = slots // self.block_size, slots % self.block_size
        starts = torch.ones(len(blocks), dtype=torch.bool)  # runs of one block are get()'s records
        starts[1:] = blocks[1:] != blocks[:-1]
        first = starts.nonzero().flatten()
        counts = torch.diff(torch.cat([first, torch.tensor([len(blocks)])]))
        runs = zip(blocks[first].tolist(), offsets[first].tolist(), counts.tolist())
        with self._lock:
            for block, first, rows in runs:
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
        _, _, _, rows = RECORD_HEADER.unpack_from(payload)
        body = torch.frombuffer(bytearray(payload[RECORD_HEADER.size:]), dtype=torch.float32)
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

    def __init__(self, store: KVStore, impl: str = "serialize", timeout_s: float = 60.0) -> None:
        self.store = store
        self.impl = impl
        self.timeout_s = timeout_s
        self.block_map: torch.Tensor | None = None  # engine block → store block; None: the same numbers
        self._error: Exception | None = None  # the first failed send since the last wait()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kv-transfer", daemon=True)
        self._thread.start()

    def publish(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                offsets: torch.Tensor) -> None:
        """Queue a layer's freshly written rows (k, v: [T, kv_heads, head_dim]) with their cache slots; the
        tensors must be the transfer's own (copies nobody writes to)."""
        self._queue.put((layer, k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1), blocks, offsets))

    def wait(self) -> None:
        """Block until every published layer is in the store; TransferTimeout after timeout_s, TransferError
        when a send failed."""
        with span("kv.transfer.wait"), self._queue.all_tasks_done:
            if not self._queue.all_tasks_done.wait_for(lambda: not self._queue.unfinished_tasks, self.timeout_s):
                raise TransferTimeout(f"KV transfer: {self._queue.unfinished_tasks} published layers did not "
                                      f"reach the store within {self.timeout_s:g} s")
        error, self._error = self._error, None
        if error is not None:
            raise TransferError(f"KV transfer failed: {error}") from error

    def busy(self) -> bool:
        """Whether published layers are still on their way."""
        return self._queue.unfinished_tasks > 0

    def close(self) -> None:
        """Drain the queue and stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # This thread's copies run on itself alone: an OpenMP team of its own would spin on the cores the
        # engine thread's GEMMs use (a per-thread setting; the engine thread keeps its threads).
        torch.set_num_threads(1)
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._send(*item)
            except Exception as err:  # reported by wait(); the thread keeps serving
                self._error = self._error or err
            finally:
                self._queue.task_done()

    def _send(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
              offsets: torch.Tensor) -> None:
        if self.block_map is not None:
            blocks = self.block_map[blocks]
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
                payload = (RECORD_HEADER.pack(layer, block_ids[first], slots[first], last - first + 1)
                           + keys[first:last + 1].tobytes() + values[first:last + 1].tobytes())
                self.store.put((layer, block_ids[first], slots[first]), payload)
            first = last + 1

    def _send_bulk(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                   offsets: torch.Tensor) -> None:
        """The whole layer in two native copies (index_copy_ releases the GIL)."""
        with span("kv.transfer", layer=layer, rows=k.shape[0]):
            self.store.put_rows(layer, k, v, blocks * self.store.block_size + offsets)
