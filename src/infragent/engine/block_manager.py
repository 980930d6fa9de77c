"""Paged KV-cache block allocation: block tables, a ref-counted free list, prefix caching by hash chain."""
from __future__ import annotations

from collections import OrderedDict

from infragent.engine.sequence import Sequence


def block_hash(parent: int | None, tokens: list[int]) -> int:
    """Hash of a full block, chained to the hash of the block before it."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    """Owns the physical KV blocks; sequences hold them through block tables."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hash_of_block: list[int | None] = [None] * num_blocks
        self.block_of_hash: dict[int, int] = {}
        # Free blocks in LRU order; cached content stays findable until the block is reused.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs so that its first num_tokens tokens have a slot."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's block table to cover num_tokens tokens (caller checked can_allocate)."""
        for _ in range(self.blocks_needed(seq, num_tokens)):
            block, _ = self.free.popitem(last=False)
            old = self.hash_of_block[block]
            if old is not None and self.block_of_hash.get(old) == block:
                del self.block_of_hash[old]
            self.hash_of_block[block] = None
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def reuse_cached_prefix(self, seq: Sequence) -> None:
        """Attach the longest run of cached full prompt blocks to a fresh seq and skip computing them."""
        if not self.enable_prefix_caching or seq.block_table or seq.params.wants_prompt_rows:
            return
        prompt = seq.prompt_token_ids
        # At least one prompt token must be computed so the last position yields logits.
        max_blocks = (len(prompt) - 1) // self.block_size
        parent: int | None = None
        for i in range(max_blocks):
            h = block_hash(parent, prompt[i * self.block_size:(i + 1) * self.block_size])
            block = self.block_of_hash.get(h)
            if block is None:
                break
            if self.ref_counts[block] == 0:
                del self.free[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
            parent = h
        seq.num_computed_tokens = seq.num_cached_tokens = len(seq.block_table) * self.block_size

    def share_prompt(self, parent: Sequence, child: Sequence, tokens: int) -> tuple[int, int] | None:
        """Give child the blocks of parent's first `tokens` tokens: full blocks shared (one more reference
        each), a partly filled last block as a fresh block of its own. Returns (parent's, child's) last block
        when its contents must be copied; the caller checked that a block is free (can_share)."""
        full, partial = divmod(tokens, self.block_size)
        for block in parent.block_table[:full]:
            self.ref_counts[block] += 1
            child.block_table.append(block)
        if not partial:
            return None
        self.allocate(child, tokens)
        return parent.block_table[full], child.block_table[full]

    def can_share(self, tokens: int) -> bool:
        """Whether share_prompt finds the block a partly filled last block needs."""
        return tokens % self.block_size == 0 or self.num_free_blocks > 0

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish hashes of seq's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        tokens = seq.token_ids
        parent: int | None = None
        for i in range(seq.num_computed_tokens // self.block_size):
            block = seq.block_table[i]
            h = self.hash_of_block[block]
            if h is None:
                h = block_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size])
                self.hash_of_block[block] = h
                self.block_of_hash.setdefault(h, block)
            parent = h

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks seq's first num_tokens tokens occupy (rejected speculative tokens)."""
        keep = -(-num_tokens // self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
        del seq.block_table[keep:]

    def free_seq(self, seq: Sequence) -> None:
        """Drop seq's references; blocks reaching zero return to the free list (most recent last)."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
        seq.block_table = []
