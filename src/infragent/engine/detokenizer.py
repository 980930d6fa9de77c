"""Streaming detokenization that never emits half of a multi-byte UTF-8 character."""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turn a stream of token ids into text deltas (prefix/read-offset window technique).

    `prefix_offset..read_offset` are ids whose text was already emitted and are kept only as left
    context (so merged byte-level tokens decode consistently); ids after `read_offset` are pending.
    A delta is emitted once the window decodes to more text than the context alone and does not
    end in U+FFFD (an incomplete UTF-8 sequence).
    """

    def __init__(self, tokenizer: _Decoder, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []  # window: context ids followed by pending ids
        self._read = 0  # index in _ids where pending (not yet emitted) ids start
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)

    def add(self, token_id: int) -> str:
        """Feed one token id; return the newly completed text (possibly '')."""
        self._ids.append(token_id)
        prefix = self._tok.decode(self._ids[: self._read], skip_special_tokens=self._skip)
        full = self._tok.decode(self._ids, skip_special_tokens=self._skip)
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""
        delta = full[len(prefix):]
        # Emitted ids become the new context; drop older context to keep decoding O(1) per token.
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        self._parts.append(delta)
        return delta

    def flush(self) -> str:
        """Emit whatever is still pending at end of stream (incomplete bytes decode as U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        prefix = self._tok.decode(self._ids[: self._read], skip_special_tokens=self._skip)
        full = self._tok.decode(self._ids, skip_special_tokens=self._skip)
        delta = full[len(prefix):]
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        self._parts.append(delta)
        return delta
