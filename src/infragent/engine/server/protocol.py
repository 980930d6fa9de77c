"""OpenAI-shaped request bodies (validated) and response/chunk builders for the two generation endpoints."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from infragent.engine.sampling import SamplingParams


class StreamOptions(BaseModel):
    """stream_options: include_usage adds a usage chunk after the final one."""

    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share; unknown fields are ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")
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
    ignore_eos: StrictBool = False  # vLLM extra: benchmarks use it to fix output lengths

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
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

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """Engine SamplingParams; SamplingParams.validate() names any bad value."""
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return SamplingParams(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=self.seed, stop=list(self.stop or []), ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: a prompt as text or token ids (one prompt: n=1, no batches)."""

    prompt: Union[str, list[StrictInt], list[str], list[list[StrictInt]]]

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

    model_config = ConfigDict(extra="ignore")
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


def new_id(prefix: str) -> str:
    """An OpenAI-style object id."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish_reason: str | None, used: dict[str, int],
                    chat: bool) -> dict[str, Any]:
    """A whole (non-streaming) response."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": used}


def chunk_body(rid: str, model: str, text: str | None, finish_reason: str | None, chat: bool,
               first: bool = False, used: dict[str, int] | None = None) -> dict[str, Any]:
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
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    body["choices"] = [choice]
    return body


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
