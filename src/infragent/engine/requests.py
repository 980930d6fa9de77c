"""A new request made into a Sequence: the prompt tokenized and every field checked against the model
(vocabulary, context), with RequestError naming the bad field."""
from __future__ import annotations

from dataclasses import replace

from infragent.engine.sampling import RequestError, SamplingParams
from infragent.engine.sequence import Sequence
from infragent.engine.tokenizer import Tokenizer


def make_sequence(tokenizer: Tokenizer, vocab_size: int, max_model_len: int, prompt: str | list[int],
                  params: SamplingParams | None = None, request_id: str = "") -> Sequence:
    """Validate and tokenize one request (RequestError names the bad field)."""
    params = replace(params) if params is not None else SamplingParams()  # resolved per request, below
    params.validate()
    if isinstance(prompt, str):
        token_ids, text = tokenizer.encode(prompt), prompt
    else:
        token_ids, text = list(prompt), None
    if not token_ids:
        raise RequestError("prompt: is empty; give at least one token")
    bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"prompt: token id {bad!r} is outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise RequestError(f"prompt: {len(token_ids)} tokens does not fit the context "
                           f"(max_model_len={max_model_len}, one position is needed to generate); "
                           f"shorten the prompt")
    room = max_model_len - len(token_ids)
    if params.max_tokens is None:
        params.max_tokens = room
    elif params.strict_context and params.max_tokens > room:
        raise RequestError(f"max_tokens: this model's context is {max_model_len} tokens; the prompt has "
                           f"{len(token_ids)}, so at most {room} can be generated, not {params.max_tokens}; "
                           "lower max_tokens or shorten the prompt")
    if params.min_tokens > params.max_tokens:
        raise RequestError(f"min_tokens: {params.min_tokens} is more than max_tokens={params.max_tokens}")
    if params.min_tokens:
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        params.banned_until_min = sorted({t for t in params.stop_token_ids + eos if t < vocab_size})
    return Sequence(token_ids, params, request_id=request_id, prompt=text, detokenizer=tokenizer.detokenizer())
