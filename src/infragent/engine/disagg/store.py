"""The KV store between prefill and decode workers: a pool of KV blocks and KDA-state slots in one
shared-memory segment, the router's small index over it, and the client each worker attaches.

Layout of the segment (fp32): K/V rows [attention layers, 2, num_blocks * block_size, row], then KDA states
[num_state_slots, kda layers, heads, dk, dv]. A request holds store blocks for its prompt and, with KDA
layers, one state slot, from dispatch to prefill until a decode worker has copied them in (admitted).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from multiprocessing import shared_memory

import torch

from infragent.engine.kv_transfer import RECORD_HEADER



@dataclass(frozen=True)
class StoreLayout:
    """Shapes of the store; the same on every process."""

    num_blocks: int
    block_size: int
    num_layers: int  # attention layers
    row: int  # kv_heads * head_dim
    num_state_slots: int
    state_shape: tuple[int, ...] = ()  # (kda layers, heads, dk, dv); () for a model without KDA

    @property
    def kv_elements(self) -> int:
        return self.num_layers * 2 * self.num_blocks * self.block_size * self.row

    @property
    def state_elements(self) -> int:
        return self.num_state_slots * _prod(self.state_shape) if self.state_shape else 0

    @property
    def nbytes(self) -> int:
        return 4 * (self.kv_elements + self.state_elements)


class KVPool:
    """K/V rows and KDA states over a buffer (a shared-memory segment, or the TCP server's own memory)."""

    def __init__(self, layout: StoreLayout, buffer: memoryview | bytearray) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        flat = torch.frombuffer(buffer, dtype=torch.float32, count=layout.kv_elements + layout.state_elements)
        self.kv = flat[:layout.kv_elements].view(layout.num_layers, 2, layout.num_blocks * layout.block_size,
                                                 layout.row)
        self.states = (flat[layout.kv_elements:].view(layout.num_state_slots, *layout.state_shape)
                       if layout.state_shape else None)

    def put_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Bulk: rows k, v [T, row] at flat slots (block * block_size + offset), one native copy each."""
        self.kv[layer, 0].index_copy_(0, slots, k)
        self.kv[layer, 1].index_copy_(0, slots, v)

    def put(self, key: tuple[int, int, int], payload: bytes) -> None:
        """Serialize: one packed record (header, K rows, V rows) of one block."""
        layer, block, first, rows = RECORD_HEADER.unpack_from(payload)
        body = torch.frombuffer(bytearray(payload[RECORD_HEADER.size:]), dtype=torch.float32).view(2, rows, -1)
        start = block * self.block_size + first
        self.kv[layer, :, start:start + rows] = body

    def put_state(self, slot: int, state: torch.Tensor) -> None:
        """A request's KDA states [kda layers, heads, dk, dv] after its prompt."""
        self.states[slot].copy_(state)

    def read(self, blocks: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first num_tokens rows held in blocks, every layer: (K, V), each [layers, num_tokens, row]."""
        slots = _slots(blocks, num_tokens, self.block_size)
        return self.kv[:, 0].index_select(1, slots), self.kv[:, 1].index_select(1, slots)

    def read_state(self, slot: int) -> torch.Tensor:
        """A copy of one state slot."""
        return self.states[slot].clone()


class SharedStore(KVPool):
    """The pool in a shared-memory segment: created by the router, attached by each worker by name."""

    def __init__(self, layout: StoreLayout, name: str | None = None) -> None:
        self._owner = name is None
        # Workers are spawned by the router and share its resource tracker, which removes the segment only if
        # the router dies without close(); attaching registers the same name again (a set: no duplicate).
        self._shm = shared_memory.SharedMemory(name=name, create=self._owner, size=max(layout.nbytes, 1))
        super().__init__(layout, self._shm.buf)

    @property
    def address(self) -> tuple:
        """What a worker needs to attach: ("shm", name, layout)."""
        return ("shm", self._shm.name, self.layout)

    def close(self) -> None:
        """Detach (and, for the creator, remove the segment)."""
        self.kv = self.states = None  # the tensors over the buffer must go before the mapping can close
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with the process
            self._shm.close()
        if self._owner:
            self._shm.unlink()


@dataclass
class StoreEntry:
    """One request's place in the store."""

    blocks: list[int]
    state_slot: int | None
    holder: int  # the worker (router's index) that may still write or read it


class StoreIndex:
    """The router's small index: which store blocks and state slot each request holds."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout
        self.free_blocks = list(range(layout.num_blocks - 1, -1, -1))
        self.free_slots = list(range(layout.num_state_slots - 1, -1, -1))
        self.entries: dict[str, StoreEntry] = {}

    def allocate(self, request_id: str, num_tokens: int, holder: int) -> StoreEntry | None:
        """Blocks for num_tokens rows (and a state slot when the model has KDA layers); None when full."""
        need = -(-num_tokens // self.layout.block_size)
        with_state = bool(self.layout.state_shape)
        if need > len(self.free_blocks) or (with_state and not self.free_slots):
            return None
        entry = StoreEntry([self.free_blocks.pop() for _ in range(need)],
                           self.free_slots.pop() if with_state else None, holder)
        self.entries[request_id] = entry
        return entry

    def free(self, request_id: str) -> None:
        """Return a request's blocks and slot (a second call is a no-op)."""
        entry = self.entries.pop(request_id, None)
        if entry is not None:
            self.free_blocks.extend(entry.blocks)
            if entry.state_slot is not None:
                self.free_slots.append(entry.state_slot)

    def held_by(self, holder: int) -> list[str]:
        """Requests whose entry the given worker holds."""
        return [rid for rid, entry in self.entries.items() if entry.holder == holder]


def _slots(blocks: list[int], num_tokens: int, block_size: int) -> torch.Tensor:
    positions = torch.arange(num_tokens)
    return torch.tensor(blocks, dtype=torch.long)[positions // block_size] * block_size + positions % block_size


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
