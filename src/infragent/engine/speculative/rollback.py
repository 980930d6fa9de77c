"""Rolling back KDA recurrent state after a verification step rejected some draft tokens.

A verification runs 1 + d tokens (the last sampled token and d drafts) through each KDA layer token by token;
afterwards only the first `keep` of them are accepted. Attention layers forget the rest by truncating the
block table; a KDA state cannot be truncated, so one of:

- Snapshot: save the state after each verified token ([window, H, dk, dv] per layer and sequence) and copy
  back the one after the last kept token.
- ReplaySSM: the state slot is a checkpoint; a ring keeps each accepted token's inputs (k, u, g, beta:
  O(dk + dv) per head instead of dk x dv). The current state is replayed from the checkpoint in closed form
  (kda_ops.kda_replay) whenever a layer needs it, and written back to the checkpoint when the ring is full.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from infragent.engine.models.kda_ops import KDASteps, kda_replay, kda_steps

ROLLBACKS = ("snapshot", "replayssm")


class _Rollback(ABC):
    """What both kinds share: the KDAStateCache's states ([slots, H, dk, dv] per layer) and the window, the
    most tokens one verification may run."""

    def __init__(self, states: list[torch.Tensor], window: int) -> None:
        self.states, self.window = states, window

    @abstractmethod
    def current(self, layer: int, slot: int) -> torch.Tensor:
        """The state a verification of this slot starts from."""

    def _steps(self, start: torch.Tensor, q, k, v, g, beta, **record) -> KDASteps:  # noqa: ANN001
        if q.shape[0] > self.window:
            raise ValueError(f"rollback: {q.shape[0]} tokens verified at once, window is {self.window}")
        return kda_steps(q, k, v, g, beta, start, **record)


class SnapshotRollback(_Rollback):
    """Per KDA layer a buffer [slots, window, H, dk, dv] of the states after each verified token; the state
    slot always holds the current state."""

    def __init__(self, states: list[torch.Tensor], window: int) -> None:
        super().__init__(states, window)
        self.snapshots = [torch.zeros(s.shape[0], window, *s.shape[1:]) for s in states]

    def current(self, layer: int, slot: int) -> torch.Tensor:
        """The state a verification of this slot starts from."""
        return self.states[layer][slot]

    def verify(self, layer: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> torch.Tensor:
        """Outputs of the 1 + d verified tokens; their states are kept until commit."""
        steps = self._steps(self.current(layer, slot), q, k, v, g, beta, record_states=True)
        self.snapshots[layer][slot, :steps.states.shape[0]] = steps.states
        return steps.o

    def commit(self, slot: int, keep: int) -> None:
        """Accept the first keep verified tokens in every layer."""
        for state, snaps in zip(self.states, self.snapshots):
            state[slot] = snaps[slot, keep - 1]

    def reset(self, slots: list[int]) -> None:
        """Nothing to clear: a snapshot is only read after the verification that wrote it."""

    def state_bytes_per_seq(self) -> int:
        """Rollback bytes one sequence holds beyond its state slot, all KDA layers."""
        return sum(s[0].nbytes for s in self.snapshots)


class ReplayRollback(_Rollback):
    """Per KDA layer a ring [slots, window, H, 2 dk + dv + 1] of accepted tokens' (k, u, g, beta); the
    state slot holds the checkpoint the ring replays from."""

    def __init__(self, states: list[torch.Tensor], window: int) -> None:
        super().__init__(states, window)
        slots, heads, dk, dv = states[0].shape if states else (0, 0, 0, 0)
        self.dk, self.dv = dk, dv
        self.rings = [torch.zeros(slots, window, heads, 2 * dk + dv + 1) for _ in states]
        self.count = [0] * slots  # accepted entries in each slot's ring (the same in every layer)
        self.folded: set[int] = set()  # slots whose checkpoint moved during this step's verification

    def current(self, layer: int, slot: int) -> torch.Tensor:
        """Checkpoint + replay of the ring's accepted tokens."""
        n = self.count[slot]
        k, u, g, _ = self._fields(self.rings[layer][slot, :n])
        return kda_replay(self.states[layer][slot], k, u, g)

    def verify(self, layer: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> torch.Tensor:
        """Outputs of the 1 + d verified tokens; their inputs go to the ring, pending commit."""
        tokens, n = q.shape[0], self.count[slot]
        start = self.current(layer, slot)
        steps = self._steps(start, q, k, v, g, beta, record_inputs=True)
        if n + tokens > self.window:  # no room: the current state becomes the checkpoint (write back)
            self.states[layer][slot] = start
            self.folded.add(slot)
            n = 0
        ring = self.rings[layer][slot, n:n + tokens]
        dk, dv = self.dk, self.dv
        ring[..., :dk], ring[..., dk:dk + dv], ring[..., dk + dv:2 * dk + dv] = steps.k, steps.u, steps.g
        ring[..., -1] = beta.float()
        return steps.o

    def commit(self, slot: int, keep: int) -> None:
        """Accept the first keep verified tokens; a full ring is written back to the checkpoint."""
        n = (0 if slot in self.folded else self.count[slot]) + keep
        self.folded.discard(slot)
        if n == self.window:
            for layer, state in enumerate(self.states):
                k, u, g, _ = self._fields(self.rings[layer][slot, :n])
                state[slot] = kda_replay(state[slot], k, u, g)
            n = 0
        self.count[slot] = n

    def reset(self, slots: list[int]) -> None:
        """Fresh slots start with an empty ring."""
        for slot in slots:
            self.count[slot] = 0
            self.folded.discard(slot)

    def state_bytes_per_seq(self) -> int:
        """Rollback bytes one sequence holds beyond its state slot (the checkpoint), all KDA layers."""
        return sum(r[0].nbytes for r in self.rings)

    def _fields(self, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dk, dv = self.dk, self.dv
        return entries[..., :dk], entries[..., dk:dk + dv], entries[..., dk + dv:2 * dk + dv], entries[..., -1]
