"""What loadgen sends: random token prompts, a prompt file, or ShareGPT conversations.

Random prompts are token-id lists (exact lengths on any OpenAI-compatible server that accepts token
prompts, as vLLM, SGLang and ours do), or the same ids as text for servers that take text only (llama.cpp's
Python server, chat endpoints), re-encoded to the asked length within 2%. Each starts with two tokens encoding
its index, so no two random prompts share even their first two tokens and prefix caching cannot skew a
benchmark.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

LENGTH_DISTRIBUTIONS = ("fixed", "uniform", "lognormal")


class DatasetError(ValueError):
    """A dataset file or option that cannot be used; the message names it and says what to do."""


@dataclass
class RequestSpec:
    """One request to send: its prompt and how many tokens to ask for."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int


def draw_lengths(n: int, mean: int, distribution: str, range_ratio: float, sigma: float,
                 rng: np.random.Generator) -> list[int]:
    """n lengths around mean: fixed; uniform in mean·[1−r, 1+r]; or lognormal with that median and sigma."""
    if mean < 1:
        raise DatasetError(f"length {mean}: must be at least 1")
    if distribution == "fixed":
        values = np.full(n, mean)
    elif distribution == "uniform":
        if not 0 <= range_ratio < 1:
            raise DatasetError(f"--random-range-ratio {range_ratio}: must be in [0, 1)")
        values = rng.integers(int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio)) + 1, size=n)
    elif distribution == "lognormal":
        values = np.round(rng.lognormal(np.log(mean), sigma, size=n))
    else:
        raise DatasetError(f"--length-dist {distribution!r}: choose one of {', '.join(LENGTH_DISTRIBUTIONS)}")
    return [max(1, int(v)) for v in values]


def random_requests(n: int, input_len: int, output_len: int, vocab_size: int, distribution: str = "fixed",
                    range_ratio: float = 0.0, sigma: float = 0.5, seed: int = 0) -> list[RequestSpec]:
    """Random token prompts whose first two tokens are unique per request."""
    if vocab_size < 1024:
        raise DatasetError(f"--vocab-size {vocab_size}: too small for unique prompt prefixes (need >= 1024)")
    rng = np.random.default_rng(seed)
    ins = draw_lengths(n, input_len, distribution, range_ratio, sigma, rng)
    outs = draw_lengths(n, output_len, distribution, range_ratio, sigma, rng)
    low = 1000  # skip the low ids, where tokenizers keep special and control tokens
    span = vocab_size - low
    requests = []
    for i, (length, out) in enumerate(zip(ins, outs)):
        body = rng.integers(low, vocab_size, size=max(length, 2)).tolist()
        body[0], body[1] = low + (i // span) % span, low + i % span
        requests.append(RequestSpec(body[:max(length, 2)], max(length, 2), out))
    return requests


def file_requests(path: str | Path, output_len: int, count_tokens: Callable[[str], int]) -> list[RequestSpec]:
    """One prompt per line of a text file, or JSONL lines {"prompt": ..., "output_len": ...}."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise DatasetError(f"--dataset-path {path}: cannot read ({err.strerror})") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompt, out = line, output_len
        if line.lstrip().startswith("{"):
            try:
                row = json.loads(line)
                prompt, out = row["prompt"], int(row.get("output_len", output_len))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise DatasetError(f"{path}:{number}: a JSON line needs a string 'prompt' and an optional "
                                   "integer 'output_len'") from None
        requests.append(RequestSpec(prompt, count_tokens(prompt), out))
    if not requests:
        raise DatasetError(f"{path}: no prompts (one per line, or JSONL with 'prompt')")
    return requests


def sharegpt_requests(path: str | Path, count_tokens: Callable[[str], int], max_prompt_len: int = 1024,
                      max_total_len: int = 2048) -> list[RequestSpec]:
    """First human turn as the prompt, the first reply's token count as output_len (vLLM's filter rules)."""
    path = Path(path)
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path}: not a readable ShareGPT JSON file ({err})") from None
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: ShareGPT data is a JSON list of {{'conversations': [...]}} objects")
    requests = []
    for row in rows:
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = str(turns[0].get("value", "")), str(turns[1].get("value", ""))
        prompt_len, out = count_tokens(prompt), count_tokens(reply)
        if prompt_len < 4 or out < 4 or prompt_len > max_prompt_len or prompt_len + out > max_total_len:
            continue  # too short to time, or too long for the context
        requests.append(RequestSpec(prompt, prompt_len, out))
    if not requests:
        raise DatasetError(f"{path}: no usable conversations (need a human turn and a reply, 4+ tokens each)")
    return requests


TEXT_TOLERANCE = 0.02  # a text prompt re-encodes to its asked length within 2% (at least 1 token either way)


def as_text(requests: list[RequestSpec], encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
            vocab_size: int, seed: int = 0) -> list[RequestSpec]:
    """Random token prompts as text, for servers that take text only (as vLLM's bench does for them): each
    prompt's ids decoded, then cut or extended with more random ids until the text re-encodes to the asked
    length within TEXT_TOLERANCE; prompt_len is the re-encoded count. The unique first two tokens stay."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in requests:
        ids = list(spec.prompt) if isinstance(spec.prompt, list) else encode(spec.prompt)
        target = spec.prompt_len
        slack = max(1, round(TEXT_TOLERANCE * target))
        text = decode(ids)
        for _ in range(8):
            n = len(encode(text))
            if abs(n - target) <= slack:
                break
            if n > target:
                ids = ids[:max(2, len(ids) - (n - target))]
            else:
                ids = ids + rng.integers(1000, vocab_size, size=target - n).tolist()
            text = decode(ids)
        out.append(RequestSpec(text, len(encode(text)), spec.output_len))
    return out
