"""What a streaming request receives step by step: Delta, and the cursor that holds back possible stop text."""
from __future__ import annotations

from dataclasses import dataclass

from infragent.engine.sampling import TokenLogprob
from infragent.engine.sequence import Sequence


@dataclass
class Delta:
    """New output of one request since the previous delta."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None  # set on the last delta
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # with params.logprobs: the tokens generated since the last delta


class TextCursor:
    """How much of a sequence's text went out; the tail that could still become a stop string waits."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self._sent = 0  # characters of seq.text already delivered
        self._holdback = max((len(s) for s in seq.params.stop), default=1) - 1
        self._logprobs_sent = 0

    def next_delta(self, finished: bool) -> Delta:
        """The text not yet sent, holding back what could still become a stop string."""
        text = self.seq.text
        end = len(text) if finished else max(self._sent, len(text) - self._holdback)
        piece, self._sent = text[self._sent:end], end
        logprobs = None
        if self.seq.params.logprobs is not None:
            logprobs = self.seq.output_logprobs[self._logprobs_sent:]
            self._logprobs_sent += len(logprobs)
        return Delta(piece, len(self.seq.output_token_ids), self.seq.finish_reason if finished else None,
                     logprobs=logprobs)
