"""Feedback: what every probe returns — verdict, numbers with CIs, locality, evidence, next probes."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERDICTS = ("pass", "fail", "inconclusive")


@dataclass
class Measure:
    """One number with its unit and, when it was estimated from samples, a confidence interval."""

    value: float
    unit: str = ""
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None

    def text(self) -> str:
        """'1.052 [1.041, 1.063] ×' style rendering."""
        def fmt(x: float) -> str:
            if x is None or (isinstance(x, float) and math.isnan(x)):
                return "n/a"
            return f"{x:.4g}"
        ci = f" [{fmt(self.ci_low)}, {fmt(self.ci_high)}]" if self.ci_low is not None else ""
        unit = f" {self.unit}" if self.unit else ""
        return f"{fmt(self.value)}{ci}{unit}"


@dataclass
class Evidence:
    """A raw artifact a verdict rests on: where it is and the hash of its bytes."""

    path: str
    sha256: str
    description: str = ""

    @classmethod
    def of(cls, path: str | Path, description: str = "") -> "Evidence":
        """Hash the file at path."""
        data = Path(path).read_bytes()
        return cls(str(path), hashlib.sha256(data).hexdigest(), description)


@dataclass
class Feedback:
    """The result of one probe, as data; render() and to_json() are the two views of it."""

    probe: str
    verdict: str  # pass | fail | inconclusive
    finding: str  # the probe's one-line conclusion, e.g. "slower by 5.1%" or "shard 2 differs"
    numbers: dict[str, Measure] = field(default_factory=dict)
    locality: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    next_probes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Feedback.verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-safe: NaN becomes null)."""
        return _json_safe(asdict(self))

    def to_json(self, indent: int = 2) -> str:
        """JSON for machines."""
        return json.dumps(self.to_dict(), indent=indent)

    def render(self, max_details: int = 12) -> str:
        """A short text block an agent can read."""
        lines = [f"[{self.probe}] {self.verdict.upper()}: {self.finding}"]
        for name, measure in self.numbers.items():
            lines.append(f"  {name}: {measure.text()}")
        if self.locality:
            lines.append("  where: " + ", ".join(f"{k}={v}" for k, v in self.locality.items()))
        for item in self.evidence:
            lines.append(f"  evidence: {item.path} (sha256 {item.sha256[:12]}) {item.description}".rstrip())
        if self.next_probes:
            lines.append("  next: " + "; ".join(self.next_probes))
        extra = [k for k in self.details if k != "raw"]
        if extra:
            lines.append(f"  details: {', '.join(extra[:max_details])} (see --json)")
        return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
