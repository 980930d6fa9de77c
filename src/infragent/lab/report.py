"""The run report: one self-contained HTML file (inline SVG, no network) built from the ledger.

report_data() gathers the numbers (data); render_html() draws them: criteria with CIs, latency CDFs,
throughput against request rate, per-bucket breakdown bars, and a timeline excerpt from a trace.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infragent.analysis.serving_metrics import bucket_of
from infragent.lab.criteria import limit_text
from infragent.lab.ledger import Ledger
from infragent.lab.trajectory import chains
from infragent.trace_model import Trace

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


@dataclass
class ReportData:
    """Everything the page shows, as plain data."""

    run: dict[str, Any]
    environment: dict[str, Any] | None
    criteria: list[dict[str, Any]] = field(default_factory=list)  # judgement rows
    latencies: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # metric -> scenario -> ms
    throughput: list[dict[str, Any]] = field(default_factory=list)  # scenario, request_rate, output tok/s
    buckets: dict[str, dict[str, float]] = field(default_factory=dict)  # "scenario bucket" -> metric -> median
    timeline: list[dict[str, Any]] = field(default_factory=list)  # spans: thread, name, start_ms, dur_ms
    probes: list[dict[str, Any]] = field(default_factory=list)
    chains: list[dict[str, Any]] = field(default_factory=list)  # hypothesis -> probe -> verdict -> decision


def report_data(ledger: Ledger, run_id: int, trace_path: str | Path | None = None, max_spans: int = 400) -> ReportData:
    """Collect the run's probes, loadgen records, judgements and (optionally) a trace excerpt."""
    run = ledger.run(run_id)
    env_row = ledger.db.execute("SELECT data FROM environments WHERE id = ?", (run["environment_id"],)).fetchone()
    data = ReportData(run, json.loads(env_row[0]) if env_row else None, chains=chains(ledger, run_id))
    for result in ledger.probe_results(run_id):
        fb = result["feedback"]
        data.probes.append({"key": result["key"], "probe": result["probe"], "verdict": result["verdict"],
                            "finding": result["finding"]})
        if result["probe"] == "criterion":
            data.criteria.extend(fb.get("details", {}).get("judgements", []))
        elif result["probe"] == "loadgen" and fb.get("evidence"):
            _add_loadgen(data, ledger, result["key"].split("/")[0], fb)
    for key in list(data.buckets):
        data.buckets[key] = {m: float(np.median(v)) for m, v in data.buckets[key].items()}  # type: ignore[arg-type]
    if trace_path:
        data.timeline = _timeline(Trace.load(trace_path), max_spans)
    return data


def _add_loadgen(data: ReportData, ledger: Ledger, scenario: str, fb: dict[str, Any]) -> None:
    sha = fb["evidence"][0]["sha256"]
    stored = ledger.artifact_root / sha[:2] / sha
    if not stored.exists():
        return
    result = json.loads(stored.read_text())
    for run in result["runs"]:
        records = [r for r in run["records"] if r["success"] and not r["warmup"]]
        for metric, values in (("TTFT", [r["ttft_s"] * 1e3 for r in records]),
                               ("TPOT", [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) * 1e3
                                         for r in records if r["output_tokens"] > 1]),
                               ("E2EL", [r["latency_s"] * 1e3 for r in records])):
            data.latencies.setdefault(metric, {}).setdefault(scenario, []).extend(values)
        data.throughput.append({"scenario": scenario, "request_rate": result["config"]["request_rate"],
                                "output_tok_s": run["metrics"]["output_throughput"]})
        for r in records:
            key = f"{scenario} {bucket_of(r['prompt_len'])}"
            slot = data.buckets.setdefault(key, {"TTFT ms": [], "E2EL ms": []})  # type: ignore[dict-item]
            slot["TTFT ms"].append(r["ttft_s"] * 1e3)  # type: ignore[attr-defined]
            slot["E2EL ms"].append(r["latency_s"] * 1e3)  # type: ignore[attr-defined]


def _timeline(trace: Trace, max_spans: int) -> list[dict[str, Any]]:
    if not trace.spans:
        return []
    origin = trace.spans[0].start_ns
    return [{"thread": trace.thread_name(s.tid), "name": s.name, "start_ms": (s.start_ns - origin) / 1e6,
             "dur_ms": s.dur_ns / 1e6} for s in trace.spans[:max_spans]]


# ---- rendering -------------------------------------------------------------------------------------------

def _e(text: Any) -> str:
    return html.escape(str(text))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.4g}"
    return _e(x)


def _criterion_row(j: dict[str, Any]) -> str:
    """One judgement as a table row: estimate (a regression for relative criteria), CI, limit, verdict."""
    lo, hi = j["ci"]
    if j.get("regression") is not None:
        estimate, ci = f"regression {j['regression']:+.1%}", f"[{lo:+.1%}, {hi:+.1%}]"
    else:
        estimate, ci = _fmt(j["value"]), f"[{_fmt(lo)}, {_fmt(hi)}]"
    ci += f" ({j['confidence']:.1%})" if j.get("confidence") else ""
    rule = j.get("rule") or ("max_regression" if j.get("regression") is not None else "")
    limit = limit_text(rule, j["limit"]) if j.get("limit") is not None else "n/a"
    cells = (j["scenario"], j["phase"], j["bucket"], j["metric"], estimate, ci, limit, j["verdict"].upper(),
             j["message"])
    return f'<tr class="verdict-{_e(j["verdict"])}">' + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"


def _cdf_svg(title: str, series: dict[str, list[float]], width: int = 460, height: int = 260) -> str:
    values = [v for vs in series.values() for v in vs]
    if not values:
        return ""
    lo, hi = 0.0, max(values) * 1.05 or 1.0
    pad = 40
    parts = [f'<svg class="chart cdf" role="img" aria-label="{_e(title)} CDF" width="{width}" height="{height}">',
             f'<text x="{pad}" y="16" class="title">{_e(title)} CDF (ms)</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - 10}" y2="{height - pad}" stroke="#999"/>',
             f'<line x1="{pad}" y1="24" x2="{pad}" y2="{height - pad}" stroke="#999"/>',
             f'<text x="{pad}" y="{height - pad + 16}" class="tick">0</text>',
             f'<text x="{width - 60}" y="{height - pad + 16}" class="tick">{hi:.3g}</text>']
    for i, (name, vs) in enumerate(sorted(series.items())):
        xs = np.sort(np.asarray(vs))
        ys = np.arange(1, xs.size + 1) / xs.size
        points = " ".join(f"{pad + (x - lo) / (hi - lo) * (width - pad - 10):.1f},"
                          f"{height - pad - y * (height - pad - 24):.1f}" for x, y in zip(xs, ys))
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<polyline class="series" data-series="{_e(name)}" fill="none" stroke="{color}" '
                     f'stroke-width="1.5" points="{points}"/>')
        parts.append(f'<text x="{width - 150}" y="{40 + 14 * i}" fill="{color}" class="legend">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _throughput_svg(points: list[dict[str, Any]], width: int = 460, height: int = 260) -> str:
    if not points:
        return ""
    finite = [p["request_rate"] for p in points if not math.isinf(p["request_rate"])]
    top_rate = max(finite) * 1.25 if finite else 1.0
    top_tok = max(p["output_tok_s"] for p in points) * 1.1 or 1.0
    pad = 40
    parts = [f'<svg class="chart throughput" role="img" aria-label="throughput vs request rate" width="{width}" '
             f'height="{height}"><text x="{pad}" y="16" class="title">Output tok/s vs request rate (req/s; '
             f'right edge = all at once)</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - 10}" y2="{height - pad}" stroke="#999"/>',
             f'<line x1="{pad}" y1="24" x2="{pad}" y2="{height - pad}" stroke="#999"/>']
    scenarios = sorted({p["scenario"] for p in points})
    for p in points:
        rate = top_rate if math.isinf(p["request_rate"]) else p["request_rate"]
        x = pad + rate / top_rate * (width - pad - 10)
        y = height - pad - p["output_tok_s"] / top_tok * (height - pad - 24)
        color = PALETTE[scenarios.index(p["scenario"]) % len(PALETTE)]
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}">'
                     f'<title>{_e(p["scenario"])}: {p["output_tok_s"]:.1f} tok/s</title></circle>')
    parts.append(f'<text x="{pad + 4}" y="36" class="tick">{top_tok:.3g} tok/s</text></svg>')
    return "".join(parts)


def _bars_html(buckets: dict[str, dict[str, float]]) -> str:
    if not buckets:
        return ""
    metrics = sorted({m for row in buckets.values() for m in row})
    rows = []
    for metric in metrics:
        top = max(row.get(metric, 0.0) for row in buckets.values()) or 1.0
        for name, row in sorted(buckets.items()):
            value = row.get(metric, float("nan"))
            share = 0 if math.isnan(value) else value / top * 100
            rows.append(f'<div class="bar-row"><span class="bar-label">{_e(metric)} · {_e(name)}</span>'
                        f'<span class="bar" style="width:{share:.1f}%"></span><span class="bar-value">'
                        f'{_fmt(value)}</span></div>')
    return '<div class="breakdown">' + "".join(rows) + "</div>"


def _timeline_svg(spans: list[dict[str, Any]], width: int = 940) -> str:
    if not spans:
        return '<p class="muted">No trace for this run (record one with <code>infragent record</code> and pass ' \
               '<code>--trace</code>).</p>'
    threads = sorted({s["thread"] for s in spans})
    names = sorted({s["name"] for s in spans})
    end = max(s["start_ms"] + s["dur_ms"] for s in spans) or 1.0
    row, left = 22, 120
    parts = [f'<svg class="chart timeline" role="img" aria-label="trace timeline" width="{width}" '
             f'height="{row * len(threads) + 30}">']
    for i, thread in enumerate(threads):
        parts.append(f'<text x="4" y="{20 + i * row + 14}" class="tick">{_e(thread[:16])}</text>')
    for s in spans:
        x = left + s["start_ms"] / end * (width - left - 10)
        w = max(0.5, s["dur_ms"] / end * (width - left - 10))
        y = 20 + threads.index(s["thread"]) * row
        color = PALETTE[names.index(s["name"]) % len(PALETTE)]
        parts.append(f'<rect class="span" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 6}" fill="{color}" '
                     f'opacity="0.75"><title>{_e(s["name"])} {s["dur_ms"]:.3f} ms</title></rect>')
    parts.append(f'<text x="{width - 90}" y="14" class="tick">{end:.1f} ms</text></svg>')
    return "".join(parts)


def render_html(data: ReportData) -> str:
    """The whole page."""
    run = data.run
    env = data.environment or {}
    crit_rows = "".join(_criterion_row(j) for j in data.criteria) or '<tr><td colspan="9">no criteria judged</td></tr>'
    probe_rows = "".join(f'<tr><td>{_e(p["key"])}</td><td>{_e(p["probe"])}</td><td>{_e(p["verdict"].upper())}</td>'
                         f'<td>{_e(p["finding"])}</td></tr>' for p in data.probes)
    cdfs = "".join(_cdf_svg(metric, series) for metric, series in sorted(data.latencies.items()))
    chain_rows = "".join(
        f'<tr class="verdict-{ {"supported": "pass", "refuted": "fail"}.get(c["status"], "inconclusive") }">'
        f'<td>{_e(c["key"])}: {_e(c["claim"])}</td><td>{_e(c["settled_by"] or c["probe"] + " (not run)")}'
        f'{": " + _e(c["probe_finding"]) if c["probe_finding"] else ""}</td><td>{_e(c["status"].upper())}</td>'
        f'<td>{_e(c["decision"])}</td></tr>' for c in data.chains) or '<tr><td colspan="4">no hypotheses</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infragent run {run['id']}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #111; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; }} td, th {{ border: 1px solid #ddd; padding: 4px 8px; }}
.verdict-fail td {{ background: #fee2e2; }} .verdict-pass td {{ background: #ecfdf5; }}
.verdict-inconclusive td {{ background: #fef9c3; }}
.chart {{ margin: 6px 12px 12px 0; background: #fafafa; }} .title {{ font-weight: 600; font-size: 12px; }}
.tick, .legend {{ font-size: 11px; }} .muted {{ color: #666; }}
.bar-row {{ display: flex; align-items: center; gap: 8px; margin: 2px 0; }}
.bar-label {{ width: 220px; font-size: 12px; }} .bar {{ display: inline-block; height: 12px; background: #2563eb; }}
.bar-value {{ font-size: 12px; }}
</style></head><body>
<h1>Run {run['id']}: {_e(run['kind'])} — {_e(run['status'])}</h1>
<p class="muted">spec {_e(run.get('spec_path'))} · commit {_e(env.get('git_commit', 'n/a'))}{' (dirty)' if env.get('git_dirty') else ''}
 · {_e(env.get('cpu', ''))} · {_e(env.get('cores', ''))} cores · torch {_e(env.get('packages', {}).get('torch', 'n/a'))}</p>
<h2 id="criteria">Criteria</h2>
<table><tr><th>scenario</th><th>phase</th><th>bucket</th><th>metric</th><th>estimate</th><th>CI</th><th>limit</th>
<th>verdict</th><th>why</th></tr>{crit_rows}</table>
<h2 id="hypotheses">Hypotheses</h2>
<table><tr><th>hypothesis</th><th>probe</th><th>verdict</th><th>decision</th></tr>{chain_rows}</table>
<h2 id="latency">Latency CDFs</h2><div>{cdfs or '<p class="muted">no loadgen results</p>'}</div>
<h2 id="throughput">Throughput against request rate</h2><div>{_throughput_svg(data.throughput)}</div>
<h2 id="breakdown">Breakdown by scenario and prompt-length bucket (medians)</h2>{_bars_html(data.buckets)}
<h2 id="timeline">Timeline excerpt</h2>{_timeline_svg(data.timeline)}
<h2 id="probes">Probes</h2><table><tr><th>key</th><th>probe</th><th>verdict</th><th>finding</th></tr>{probe_rows}</table>
</body></html>
"""


def write_report(ledger: Ledger, run_id: int, output: str | Path, trace_path: str | Path | None = None) -> Path:
    """Build and write the report; return its path."""
    output = Path(output)
    output.write_text(render_html(report_data(ledger, run_id, trace_path)))
    return output
