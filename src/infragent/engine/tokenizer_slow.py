"""The byte-level BPE merges in pure Python, as transformers' slow tokenizers (GPT2Tokenizer) do them: what a
server runs with `--tokenizer-mode slow` (vLLM has the same flag). Same ids as the native tokenizer; the
merge loop holds the GIL for the whole prompt, which is the point of offering it: it is a bottleneck a user
can hit, and the diagnosis must see it from outside.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable


class SlowBPE:
    """Encode text with Python merges over the vocabulary and merge ranks of a byte-level BPE model."""

    def __init__(self, vocab: dict[str, int], merges: Iterable[tuple[str, str]], specials: Iterable[str],
                 pre_tokenize: Callable[[str], list[str]]) -> None:
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        ordered = sorted(specials, key=len, reverse=True)  # the longest special first where two overlap
        self.specials = re.compile("(" + "|".join(re.escape(s) for s in ordered) + ")") if ordered else None
        self.pre_tokenize = pre_tokenize
        self.cache: dict[str, list[int]] = {}  # per word, as GPT2Tokenizer keeps one

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special-token strings map to their ids."""
        ids: list[int] = []
        parts = self.specials.split(text) if self.specials else [text]
        for i, part in enumerate(parts):
            if i % 2:  # a special token (the split keeps them at odd positions)
                ids.append(self.vocab[part])
                continue
            for word in self.pre_tokenize(part) if part else ():
                ids.extend(self._word(word))
        return ids

    def _word(self, word: str) -> list[int]:
        known = self.cache.get(word)
        if known is not None:
            return known
        pieces = list(word)
        while len(pieces) > 1:
            pairs = [(self.ranks.get((a, b)), j) for j, (a, b) in enumerate(zip(pieces, pieces[1:]))]
            ranked = [(rank, j) for rank, j in pairs if rank is not None]
            if not ranked:
                break
            best = pieces[min(ranked)[1]], pieces[min(ranked)[1] + 1]
            merged, j = [], 0
            while j < len(pieces):
                if j + 1 < len(pieces) and (pieces[j], pieces[j + 1]) == best:
                    merged.append(pieces[j] + pieces[j + 1])
                    j += 2
                else:
                    merged.append(pieces[j])
                    j += 1
            pieces = merged
        ids = [self.vocab[p] for p in pieces]
        self.cache[word] = ids
        return ids
