"""N-gram prompt lookup (no extra weights): find the latest earlier occurrence of the sequence's last n tokens
(n from prompt_lookup_max down to prompt_lookup_min) and propose the tokens that followed it."""
from __future__ import annotations


def propose_ngram(tokens: list[int], k: int, n_max: int = 4, n_min: int = 1) -> list[int]:
    """Up to k draft tokens continuing tokens, or [] when no n-gram of the tail recurs."""
    if k <= 0:
        return []
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = tokens[size - n:]
        for start in range(size - n - 1, -1, -1):  # latest match first; it must have a follower
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []
