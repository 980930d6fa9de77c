"""LLM: the offline API — LLM(model=...).generate(prompts, SamplingParams)."""
from __future__ import annotations

from typing import Sequence as Seq

from infragent.engine.config import EngineConfig, HybridConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.outputs import RequestOutput
from infragent.engine.sampling import RequestError, SamplingParams
from infragent.engine.tokenizer import Tokenizer


class LLM:
    """Generate completions for a list of prompts with continuous batching."""

    def __init__(self, model: str = "llama", hybrid: HybridConfig | None = None, **knobs: object) -> None:
        config = EngineConfig(model=model, hybrid=hybrid or HybridConfig(), **knobs)  # type: ignore[arg-type]
        self.engine = LLMEngine(config)

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """The offline API over an engine that is already built (its caches must be idle)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    def close(self) -> None:
        """Stop the engine's helpers (tensor-parallel workers, transfer thread)."""
        self.engine.close()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (encode, decode, chat template)."""
        return self.engine.tokenizer

    def generate(self, prompts: str | Seq[str] | Seq[list[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Complete every prompt; a rejected prompt gets an output with .error and the rest still run."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise RequestError(f"sampling_params: got {len(params)} for {len(prompts)} prompts; "
                                   f"give one, or one per prompt")
        results: list[RequestOutput | None] = [None] * len(prompts)
        index_of: dict[int, int] = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                seq = self.engine.add_request(prompt, SamplingParams(**vars(p)), request_id=f"{i}")
                index_of[seq.seq_id] = i
            except RequestError as err:
                results[i] = RequestOutput(f"{i}", prompt if isinstance(prompt, str) else None,
                                           [], [], "", None, error=str(err))
        while self.engine.has_unfinished():
            for seq in self.engine.step():
                results[index_of[seq.seq_id]] = self.engine.output(seq)
        return [r for r in results if r is not None]

    def chat(self, conversations: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        return self.generate(prompts, sampling_params)
