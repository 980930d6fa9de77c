"""RequestOutput: what a finished (or rejected) request returns to the caller."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infragent.engine.sampling import TokenLogprob


@dataclass
class RequestOutput:
    """The completion of one request, or the error that rejected it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop", "length", or None when rejected
    error: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # with SamplingParams.prompt_logprobs: [prompt tokens, vocab], row i = log p(next token | prompt[:i + 1])
    prompt_logprobs: torch.Tensor | None = None
    logprobs: list[TokenLogprob] | None = None  # with SamplingParams.logprobs: one per generated token
    prompt_top_logprobs: list[TokenLogprob] | None = None  # with prompt_top_logprobs: prompt tokens 1.. in order

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time
