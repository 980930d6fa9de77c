"""The compact view of a Feedback: what an agent needs to act, in at most REPLY_LIMIT bytes whatever the
inputs — the verdict, the finding, the key numbers with their intervals, the locality and the next probes.
Everything else (per-trial and per-shard tables, samples, raw outputs) stays in the full Feedback, which is
saved as an artifact and named in the reply, so nothing is lost and a slice of it can be read on demand.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure

REPLY_LIMIT = 4096  # bytes of JSON
FINDING_CHARS = 900
VALUE_CHARS = 160
MAX_NUMBERS = 12
MAX_LOCALITY = 12
MAX_NEXT = 4


def compact(feedback: Feedback, limit: int = REPLY_LIMIT, keep_full: bool = True) -> dict[str, Any]:
    """The reply for an agent (≤ limit bytes as JSON); keep_full saves the whole Feedback as an artifact
    and names it under "full"."""
    reply: dict[str, Any] = {
        "probe": feedback.probe,
        "verdict": feedback.verdict,
        "finding": _clip(feedback.finding, FINDING_CHARS),
        "numbers": {_clip(k, 60): _number(m) for k, m in list(feedback.numbers.items())[:MAX_NUMBERS]},
        "locality": {_clip(str(k), 60): _short(v) for k, v in list(feedback.locality.items())[:MAX_LOCALITY]},
        "next_probes": [_clip(p, 240) for p in feedback.next_probes[:MAX_NEXT]],
        "evidence": [e.path for e in feedback.evidence[:4]],
    }
    if len(feedback.numbers) > MAX_NUMBERS:
        reply["numbers_left_out"] = len(feedback.numbers) - MAX_NUMBERS
    if keep_full:
        full = save_json(f"{feedback.probe}-feedback", feedback.to_dict(),
                         "the whole Feedback: details, per-trial and per-shard tables, samples")
        reply["full"] = full.path
    return _fit(reply, limit)


def compact_json(feedback: Feedback, limit: int = REPLY_LIMIT) -> str:
    """compact() as JSON text."""
    return json.dumps(compact(feedback, limit))


def as_tool_calls(next_probes: list[str], tools: set[str],
                  positional: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """next_probes (written for the CLI) as tool calls for an MCP client: {"tool", "arguments", "why"} where
    the text names one of `tools` (arguments from its name=value and --flag value parts, and from the word
    right after the tool's name for a tool in `positional`, which names that argument, when the word is a
    callable, a path or a placeholder; an upper-case placeholder such as N or CANDIDATE is left for the caller
    to fill), else {"why"} alone."""
    calls = []
    for text in next_probes:
        words = re.findall(r"[A-Za-z_]+", text)
        tool = next((w for w in words if w in tools), None)
        if tool is None:
            calls.append({"why": text})
            continue
        arguments: dict[str, Any] = {}
        first = re.search(rf"\b{tool}\s+([^\s,;()]+)", text)
        value = first.group(1).rstrip(".") if first else ""
        if tool in (positional or {}) and re.search(r"[:/.]|^[A-Z][A-Z_]*$", value) and not value.startswith("-"):
            arguments[positional[tool]] = value
        for key, value in re.findall(r"\b([a-z_]+)=([^\s,;)]+)", text):
            arguments[key] = _argument(value)
        for flag, value in re.findall(r"--([a-z][a-z-]*)(?:\s+([^\s|;()]+))?", text):
            key = flag.replace("-", "_")
            if key not in arguments and value and not value.startswith(("--", "...")):
                arguments[key] = _argument(value)
        calls.append({"tool": tool, "arguments": arguments, "why": text})
    return calls


def _argument(value: str) -> Any:
    """'120' -> 120, '0.5' -> 0.5, anything else as text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def render_compact(feedback: Feedback) -> str:
    """The compact view as text for a terminal."""
    reply = compact(feedback)
    lines = [f"[{reply['probe']}] {reply['verdict'].upper()}: {reply['finding']}"]
    lines += [f"  {name}: {Measure(**{'value': None, **number}).text()}" for name, number in reply["numbers"].items()]
    if reply["locality"]:
        lines.append("  where: " + ", ".join(f"{k}={v}" for k, v in reply["locality"].items()))
    lines += [f"  evidence: {path}" for path in reply["evidence"]]
    if reply["next_probes"]:
        lines.append("  next: " + "; ".join(reply["next_probes"]))
    if "full" in reply:
        lines.append(f"  full result: {reply['full']} (--verbose prints it)")
    return "\n".join(lines)


def _fit(reply: dict[str, Any], limit: int) -> dict[str, Any]:
    """Shrink the reply until its JSON fits: fewer numbers and locality keys, then a shorter finding."""
    while len(json.dumps(reply).encode()) > limit:
        for key in ("evidence", "next_probes", "numbers", "locality"):
            items = reply[key]
            if len(items) > 1:
                reply[key] = (items[:-1] if isinstance(items, list) else dict(list(items.items())[:-1]))
                reply[f"{key}_left_out"] = reply.get(f"{key}_left_out", 0) + 1
                break
        else:
            if len(reply["finding"]) <= 80:
                reply["finding"] = reply["finding"][:40]
                reply["numbers"], reply["locality"] = {}, {}
                if len(json.dumps(reply).encode()) > limit:
                    raise ValueError(f"a compact reply cannot fit in {limit} bytes")
                return reply
            reply["finding"] = _clip(reply["finding"], len(reply["finding"]) // 2)
    return reply


def _number(measure: Measure) -> dict[str, Any]:
    """A Measure as {value, unit, ci_low, ci_high, n}, without the empty fields."""
    data = {"value": measure.value, "unit": measure.unit, "ci_low": measure.ci_low, "ci_high": measure.ci_high,
            "n": measure.n}
    return {k: _json_number(v) for k, v in data.items() if v not in (None, "")}


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _short(value: Any) -> Any:
    """A locality value cut to VALUE_CHARS when rendered."""
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _clip(text, VALUE_CHARS)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"
