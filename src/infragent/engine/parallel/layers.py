"""The tensor-parallel pieces that talk to other ranks: row-parallel linears (partial sums all-reduced) and a
vocab-parallel LM head (greedy picks the winner from each rank's local best, never gathering the vocabulary).

The row-parallel product is where precision matters: each rank's partial sum over its slice of K is
computed in `precision` (fp32; reduced: bf16 operands, as a tensor-core GEMM would; 3-pass: the bf16x3
split hi·hi + hi·lo + lo·hi), then summed across ranks in fp32.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from infragent.engine.options import PARTIAL_PRECISIONS
from infragent.engine.precision import matmul



class _Sharded:
    """A rank's slice of a linear (layers.Linear), seen from outside as that linear."""

    linear = None

    @property
    def weight_t(self) -> torch.Tensor:
        return self.linear.weight_t

    def weight_bytes(self) -> int:
        """Bytes of this rank's weight slice."""
        return self.linear.weight_bytes()


class RowParallel(_Sharded):
    """A linear whose input features are split across ranks: y = all_reduce(x_local · W_local)."""

    def __init__(self, linear, precision: str = "fp32") -> None:  # noqa: ANN001 (layers.Linear)
        self.linear = linear
        self.mode = PARTIAL_PRECISIONS[precision]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.linear(x) if self.mode == "fp32" else matmul(x, self.linear.weight_t, self.mode)
        dist.all_reduce(partial)
        return partial


class VocabParallelHead(_Sharded):
    """The LM head over this rank's vocabulary rows [offset, offset + local)."""

    def __init__(self, linear, offset: int, vocab_size: int) -> None:  # noqa: ANN001 (layers.Linear)
        self.linear, self.offset, self.vocab_size = linear, offset, vocab_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Full logits [N, vocab] on every rank (all-gather of the slices): for sampling and log-probs."""
        local = self.linear(x).contiguous()
        world = dist.get_world_size()
        sizes = [torch.empty(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([local.shape[1]]))
        pieces = [torch.empty(local.shape[0], int(s), dtype=local.dtype) for s in sizes]
        dist.all_gather(pieces, local)
        return torch.cat(pieces, dim=1)

    def greedy(self, x: torch.Tensor) -> torch.Tensor:
        """Global argmax token of each row: each rank's (max, index) pair is all that crosses ranks."""
        best, index = self.linear(x).float().max(dim=1)
        pair = torch.stack([best, (index + self.offset).float()], dim=1).contiguous()  # ids < 2^24: exact
        pairs = [torch.empty_like(pair) for _ in range(dist.get_world_size())]
        dist.all_gather(pairs, pair)
        stacked = torch.stack(pairs)  # [world, N, 2]; ties go to the lowest rank, as a full argmax would
        winner = stacked[..., 0].argmax(dim=0)
        return stacked[winner, torch.arange(pair.shape[0]), 1].long()
