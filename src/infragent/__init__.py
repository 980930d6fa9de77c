"""infragent: an infrastructure agent for LLM inference, with the serving engine it optimizes."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "EngineConfig", "HybridConfig"]


def __getattr__(name: str):
    # Lazy, so `import infragent` (and the CLI's --help) stays fast and torch loads only when needed.
    if name == "LLM":
        from infragent.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from infragent.engine.sampling import SamplingParams
        return SamplingParams
    if name in ("EngineConfig", "HybridConfig"):
        from infragent.engine import config
        return getattr(config, name)
    raise AttributeError(f"module 'infragent' has no attribute {name!r}")
