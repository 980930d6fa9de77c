"""SamplingParams (validated per request) and the batched sampler."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


class RequestError(ValueError):
    """A request is invalid; the message names the field. Other requests are unaffected."""


GREEDY_BELOW = 1e-5  # temperatures this small are argmax: dividing logits by them overflows to inf


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop (vLLM names and meanings)."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k cut
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    # offline API: keep log-probabilities over the whole vocabulary at every prompt position (vocab × 4 bytes
    # per prompt token); the prefix cache is bypassed so every position is computed
    prompt_logprobs: bool = False

    def validate(self) -> None:
        """Raise RequestError naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0.0):
            raise RequestError(f"temperature: must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise RequestError(f"top_k: must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and -2**63 <= self.seed < 2**64):
            raise RequestError(f"seed: must be a 64-bit integer, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise RequestError("stop: every stop string must be a non-empty string")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k set and the top-p nucleus with -inf (one row)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token crossing top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """Pick one token per row of logits [B, vocab] according to each row's params."""
    greedy_ids = torch.argmax(logits, dim=-1).tolist()
    out: list[int] = []
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            out.append(greedy_ids[row])
            continue
        row_logits = _filter_top_k_top_p(logits[row].float() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row_logits, dim=-1)
        out.append(int(torch.multinomial(probs, 1, generator=gen).item()))
    return out
