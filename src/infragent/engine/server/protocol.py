"""OpenAI-shaped request bodies (validated) and response/chunk builders for the two generation endpoints."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from infragent.engine.sampling import MAX_LOGPROBS, SamplingParams

MAX_CHOICES = 8  # most choices (n) one request may ask for: each holds a running place

# Fields this server does not implement: a request that sets one (to anything but its no-op value) is refused
# with a 400 naming it, never answered as if it had been honoured.
UNSUPPORTED = {"response_format": ({"type": "text"},), "tools": ([],), "tool_choice": ("none",),
               "functions": ([],), "function_call": ("none",), "logit_bias": ({},), "suffix": ("",),
               "best_of": (1,), "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": ()}


def lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string in value holding a lone UTF-16 surrogate (which no tokenizer takes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"{path} (character {err.start})"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = lone_surrogate(key, path) if isinstance(key, str) else None
        found = found or lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


class StreamOptions(BaseModel):
    """stream_options: include_usage adds a usage chunk after the final one."""

    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: StrictBool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share, strictly typed (a number sent as a string is refused); unknown fields are
    ignored, as OpenAI-compatible servers do, but the ones in UNSUPPORTED are refused."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: Optional[str] = None
    max_tokens: Optional[StrictInt] = None
    max_completion_tokens: Optional[StrictInt] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[StrictInt] = None  # an extra field, as vLLM accepts it
    seed: Optional[StrictInt] = None
    stop: Optional[Union[str, list[str]]] = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: Optional[str] = None
    ignore_eos: StrictBool = False  # vLLM extras: benchmarks use it to fix output lengths
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    min_tokens: StrictInt = 0

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_served(cls, data: Any) -> Any:
        if isinstance(data, dict):
            where = lone_surrogate(data, "")
            if where:
                raise ValueError(f"{where}: holds a lone UTF-16 surrogate, which is not text; send valid "
                                 "Unicode (pair the surrogate or drop it)")
            for name, no_ops in UNSUPPORTED.items():
                if name in data and data[name] is not None and data[name] not in no_ops:
                    raise ValueError(f"{name}: not supported by this server; leave it out")
        return data

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"must be between 1 and {MAX_CHOICES}")
        return n

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> list[str] | None:
        if stop is None:
            return None
        stops = [stop] if isinstance(stop, str) else stop
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("give at most 4 non-empty stop strings")
        return stops

    def sampling_params(self, default_max_tokens: int | None) -> SamplingParams:
        """Engine SamplingParams (default_max_tokens None: the rest of the context; an explicit max_tokens
        past the context is an error); SamplingParams.validate() names any bad value."""
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return SamplingParams(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            strict_context=max_tokens is not None,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=self.seed, stop=list(self.stop or []), ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            stop_token_ids=list(self.stop_token_ids), min_tokens=self.min_tokens,
            logprobs=self.token_logprobs(), prompt_top_logprobs=self.prompt_logprobs_wanted())

    def token_logprobs(self) -> int | None:
        """Alternatives per generated token, or None when no logprobs were asked for."""
        return None

    def prompt_logprobs_wanted(self) -> int | None:
        """Alternatives per prompt token (completions' echo with logprobs), or None."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: a prompt as text or token ids (one prompt: n=1, no batches)."""

    prompt: Union[str, list[StrictInt], list[str], list[list[StrictInt]]]
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_LOGPROBS)  # legacy: alternatives per token
    echo: Optional[StrictBool] = None  # the prompt comes back before the completion (with logprobs: its too)

    def token_logprobs(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_wanted(self) -> int | None:
        return self.logprobs if self.echo else None

    @property
    def scores_only(self) -> bool:
        """echo with max_tokens 0: the prompt's log-probabilities and no completion (loglikelihood scoring)."""
        return bool(self.echo) and (self.max_tokens == 0 or self.max_completion_tokens == 0)

    def sampling_params(self, default_max_tokens: int | None) -> SamplingParams:
        params = super().sampling_params(default_max_tokens)
        if self.scores_only:
            params.max_tokens = 1  # the engine computes one token; the reply leaves it out
        return params

    def single_prompt(self) -> str | list[int]:
        """The one prompt; a list of several prompts is refused (this server answers one per request)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("prompt: send one prompt per request (got a batch of "
                                 f"{len(prompt)})")
            prompt = prompt[0]
        return prompt  # type: ignore[return-value]


class ChatMessage(BaseModel):
    """One message: a role and text content (or text parts)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict[str, Any]]]

    def text(self) -> str:
        """Content as plain text; only text parts are accepted."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("messages: only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        return self

    def token_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def new_id(prefix: str) -> str:
    """An OpenAI-style object id."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice_body(index: int, text: str, finish_reason: str | None, chat: bool,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One choice of a whole (non-streaming) response."""
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish_reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_body(rid: str, model: str, choices: list[dict[str, Any]], used: dict[str, int],
                    chat: bool) -> dict[str, Any]:
    """A whole (non-streaming) response."""
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": used}


def chunk_body(rid: str, model: str, text: str | None, finish_reason: str | None, chat: bool,
               first: bool = False, used: dict[str, int] | None = None,
               logprobs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    """One streaming chunk; with used and no text it is the trailing usage chunk (empty choices)."""
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": int(time.time()), "model": model}
    if used is not None:
        body.update(choices=[], usage=used)
        return body
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    body["choices"] = [choice]
    return body


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
