"""Per-sequence recurrent-state slots for the KDA layers."""
from __future__ import annotations

from infragent.engine.sequence import Sequence


class StateSlots:
    """Hands out one state slot per running sequence; the runner zeroes a slot when it is taken."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.free = list(range(num_slots - 1, -1, -1))
        self.fresh: list[int] = []  # slots handed out since the runner last zeroed them

    def allocate(self, seq: Sequence) -> None:
        """Give seq a slot if it has none."""
        if seq.state_slot is None:
            if not self.free:
                raise RuntimeError("no free KDA state slot; max_num_seqs bounds running sequences, so this is a bug")
            seq.state_slot = self.free.pop()
            self.fresh.append(seq.state_slot)

    def free_seq(self, seq: Sequence) -> None:
        """Return seq's slot."""
        if seq.state_slot is not None:
            self.free.append(seq.state_slot)
            seq.state_slot = None

    def take_fresh(self) -> list[int]:
        """Slots that must be zeroed before use; clears the list."""
        fresh, self.fresh = self.fresh, []
        return fresh
