"""Log-probabilities in OpenAI's two response formats: chat's per-token objects, and completions' legacy
parallel lists (tokens, token_logprobs, top_logprobs, text_offset)."""
from __future__ import annotations

from typing import Any, Callable

from infragent.engine.sampling import TokenLogprob

TokenText = Callable[[int], bytes]  # a token id's bytes (Tokenizer.token_bytes)


def _entry(token_bytes: TokenText, token: int, logprob: float | None) -> tuple[str, dict[str, Any]]:
    raw = token_bytes(token)
    text = raw.decode("utf-8", errors="replace")
    return text, {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(items: list[TokenLogprob], token_bytes: TokenText) -> dict[str, Any]:
    """Chat's logprobs object: per token its text, log-probability, bytes and the top alternatives."""
    content = []
    for item in items:
        _, entry = _entry(token_bytes, item.token, item.logprob)
        entry["top_logprobs"] = [_entry(token_bytes, t, lp)[1] for t, lp in item.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(items: list[TokenLogprob | None], tokens: list[int], token_bytes: TokenText,
                        offset: int = 0) -> dict[str, Any]:
    """Completions' (legacy) logprobs object over tokens, items[i] the logprob of tokens[i] (None for an
    echoed prompt's first token); text offsets count characters from offset."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, item in zip(tokens, items):
        text, _ = _entry(token_bytes, token, None)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        out["token_logprobs"].append(None if item is None else item.logprob)
        if item is None:
            out["top_logprobs"].append(None)
            continue
        top = {_entry(token_bytes, t, None)[0]: lp for t, lp in item.top}
        top.setdefault(text, item.logprob)  # the chosen token is always there, as vLLM answers
        out["top_logprobs"].append(top)
    return out
