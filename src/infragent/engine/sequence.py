"""Sequence: one request's tokens, progress and cache placement as the engine sees it."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from infragent.engine.detokenizer import IncrementalDetokenizer
from infragent.engine.sampling import SamplingParams, TokenLogprob

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A request in flight: prompt, generated tokens, computed prefix, blocks and state slot."""

    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    prompt: str | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None
    num_preemptions: int = 0
    finish_reason: str | None = None
    text: str = ""  # detokenized output so far (cut at a stop string when one matched)
    detokenizer: IncrementalDetokenizer | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: torch.Generator | None = None
    draft_token_ids: list[int] = field(default_factory=list)  # this step's speculative tokens, not yet accepted
    prompt_logprobs: dict[int, torch.Tensor] = field(default_factory=dict)  # first position → [n, vocab] rows
    # with params.prompt_top_logprobs: first position of a chunk → the next prompt token's logprob per row
    prompt_top: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # with params.logprobs, one per output token
    # parallel sampling (n > 1): the other choices, waiting for this sequence's prompt; each starts from its
    # KV and state once computed (the prompt is prefilled once), with a first token sampled from the same row
    forks: list["Sequence"] = field(default_factory=list)
    forked_token: int | None = None  # a fork's first token, sampled with the parent's
    seq_id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self) -> None:
        if not self.request_id:
            self.request_id = f"req-{self.seq_id}"
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV/state is not yet in the cache (prompt remainder, or the last sampled token and
        this step's drafts)."""
        return len(self) - self.num_computed_tokens + len(self.draft_token_ids)
