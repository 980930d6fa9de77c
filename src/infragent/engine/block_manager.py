"""Paged KV-cache block allocation: block tables, ref-counted free lists, prefix caching by hash chain.

A free block is handed out in this order: one freed with nothing findable in it (the most recently freed
first: its pages are resident and warm), then a block never used, and only then one that holds a cached
prefix (least recently freed first). The pool is allocated on demand (kv_cache.zeros_on_demand), so without
prefix caching the pages the run touches follow its peak working set, not kv_cache_gb. With prefix caching,
full blocks stay findable after they are freed, and the pool grows toward kv_cache_gb as cached prompts
accumulate: memory spent on reusable prefixes (evicting them before touching unused blocks cut a repeated
run's hit rate to near zero).
"""
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
        self.free_plain: OrderedDict[int, None] = OrderedDict()  # used, holding nothing findable
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # used, a findable prefix; LRU order
        self.never_used = list(range(num_blocks - 1, -1, -1))  # popped from the end: lowest first

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_plain) + len(self.free_cached) + len(self.never_used)

    @property
    def num_used_ever(self) -> int:
        """Blocks that have held tokens at some point (their pages are resident)."""
        return self.num_blocks - len(self.never_used)

    def _take_free(self) -> int:
        """A free block, in the order the module docstring gives; a cached prefix in it is forgotten."""
        if self.free_plain:
            return self.free_plain.popitem(last=True)[0]
        if self.never_used:
            return self.never_used.pop()
        if self.free_cached:
            block = self.free_cached.popitem(last=False)[0]
            old = self.hash_of_block[block]
            if old is not None and self.block_of_hash.get(old) == block:
                del self.block_of_hash[old]
            return block
        raise RuntimeError("no free KV block (the caller checks can_allocate)")

    def _release(self, block: int) -> None:
        """Drop one reference to block; at zero it joins the free list its contents call for."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            h = self.hash_of_block[block]
            findable = h is not None and self.block_of_hash.get(h) == block
            (self.free_cached if findable else self.free_plain)[block] = None

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs so that its first num_tokens tokens have a slot."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's block table to cover num_tokens tokens (caller checked can_allocate)."""
        for _ in range(self.blocks_needed(seq, num_tokens)):
            block = self._take_free()
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
                del self.free_cached[block]
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
            self._release(block)
        del seq.block_table[keep:]

    def free_seq(self, seq: Sequence) -> None:
        """Drop seq's references; blocks reaching zero return to a free list (most recent last)."""
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
