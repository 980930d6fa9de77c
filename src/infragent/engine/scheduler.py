"""Continuous batching: chunked prefill and decodes share one token budget; FCFS; preemption by recompute."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from infragent.engine.block_manager import BlockManager
from infragent.engine.sequence import Sequence, SequenceStatus
from infragent.engine.state_slots import StateSlots


@dataclass
class ScheduledBatch:
    """What one engine step computes: each sequence with how many of its tokens to run."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    """Decides each step which sequences run and how many tokens each computes."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, blocks: BlockManager,
                 slots: StateSlots | None) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = blocks
        self.slots = slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence at the back (FCFS)."""
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Fill the token budget: running sequences first (oldest first), then admit waiting ones."""
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.blocks.can_allocate(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                batch.num_preempted += 1
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            self.blocks.allocate(seq, seq.num_computed_tokens + n)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            i += 1
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.reuse_cached_prefix(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            if not self.blocks.can_allocate(seq, seq.num_computed_tokens + n):
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.blocks.allocate(seq, seq.num_computed_tokens + n)
            if self.slots is not None:
                self.slots.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

    def can_admit_running(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether admit_running would find a place for seq with num_tokens computed tokens."""
        return len(self.running) < self.max_num_seqs and self.blocks.can_allocate(seq, num_tokens)

    def admit_running(self, seq: Sequence) -> None:
        """Admit a sequence whose first seq.num_computed_tokens tokens were computed elsewhere (disaggregated
        prefill) straight into the running set, with blocks for them and a state slot (check first)."""
        self.blocks.allocate(seq, seq.num_computed_tokens)
        if self.slots is not None:
            self.slots.allocate(seq)
            self.slots.fresh.remove(seq.state_slot)  # its state arrives with it: do not zero it
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def admit_fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None | bool:
        """Start child running from parent's computed prompt (its KV blocks shared, its state slot fresh for
        a copy). Returns False when there is no room (a running place, a block), else share_prompt's pair."""
        tokens = len(parent.prompt_token_ids)
        if len(self.running) >= self.max_num_seqs or not self.blocks.can_share(tokens):
            return False
        copy = self.blocks.share_prompt(parent, child, tokens)
        child.num_computed_tokens = child.num_cached_tokens = tokens
        if self.slots is not None:
            self.slots.allocate(child)
            self.slots.fresh.remove(child.state_slot)  # it gets the parent's state, not zeros
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        return copy

    def _preempt(self, seq: Sequence) -> None:
        """Free everything seq holds and requeue it at the front; its tokens are recomputed later."""
        self.running.remove(seq)
        self.blocks.free_seq(seq)
        if self.slots is not None:
            self.slots.free_seq(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort(self, seq: Sequence) -> None:
        """Drop seq from the queue or the running set and release what it holds."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.blocks.free_seq(seq)  # a preempted-then-requeued or prefix-cached seq may hold blocks
            seq.status = SequenceStatus.FINISHED
        elif seq.status is SequenceStatus.RUNNING:
            self.finish(seq)

    def finish(self, seq: Sequence) -> None:
        """Release a finished sequence's blocks and slot."""
        self.running.remove(seq)
        self.blocks.free_seq(seq)
        if self.slots is not None:
            self.slots.free_seq(seq)
        seq.status = SequenceStatus.FINISHED
