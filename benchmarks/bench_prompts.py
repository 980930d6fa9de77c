"""Benchmark prompts: distinct windows of real text token ids, fixed lengths, fresh per round."""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

TEXT_MODULES = ("argparse", "collections", "dataclasses", "functools", "inspect", "json", "pathlib",
                "subprocess", "threading", "typing", "unittest", "email", "logging", "asyncio", "sqlite3")


def corpus_text() -> str:
    """Real English text available offline: Python's LICENSE plus stdlib module docstrings."""
    parts = []
    license_file = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "LICENSE.txt"
    for candidate in (license_file, Path("/usr/lib") / license_file.parent.name / "LICENSE.txt"):
        if candidate.is_file():
            parts.append(candidate.read_text(errors="replace"))
            break
    for name in TEXT_MODULES:
        try:
            module = __import__(name)
        except ImportError:
            continue
        parts += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(module)
                  if inspect.isclass(obj) or inspect.isfunction(obj)]
        parts.append(inspect.getdoc(module) or "")
    return "\n\n".join(p for p in parts if p)


def encode_corpus(gguf_path: str) -> tuple[list[int], str]:
    """Token ids of the corpus with infragent's GGUF tokenizer (the vocabulary every engine shares)."""
    from infragent.engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_path).encode(corpus_text()), "infragent"


@dataclass
class PromptWindows:
    """Hands out windows of a token stream, each starting at an offset never used before."""

    stream: list[int]
    stride: int
    next_offset: int = 0

    def take(self, length: int) -> list[int]:
        """The next window of exactly length tokens (distinct start, so no shared cached prefix)."""
        if self.next_offset + length > len(self.stream):
            raise ValueError(f"token stream of {len(self.stream)} ids is too short; lower repeats or stride")
        window = self.stream[self.next_offset:self.next_offset + length]
        self.next_offset += self.stride
        return window


def make_windows(stream: list[int], needed: int, longest: int) -> PromptWindows:
    """Spread `needed` distinct start offsets over the stream, leaving room for the longest window."""
    room = len(stream) - longest
    if room < needed:
        raise ValueError(f"token stream of {len(stream)} ids cannot give {needed} distinct windows")
    return PromptWindows(stream, stride=max(1, room // needed))


def round_spec(windows: PromptWindows, concurrencies: dict[str, int], prompt_len: int,
               prefill_len: int) -> dict:
    """Prompts for one round: warm-up, each concurrency's batch, and one long prefill prompt."""
    return {
        "warmup": [windows.take(prefill_len)] + [windows.take(prompt_len) for _ in range(3)],
        "prompts": {key: [windows.take(prompt_len) for _ in range(c)] for key, c in concurrencies.items()},
        "prefill_prompt": windows.take(prefill_len),
    }
