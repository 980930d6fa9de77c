"""One probe's result as a page (`loadgen --html`, `analyze --html`, `bench --html`): the same look and the same
drawing code as the run report, for a single Feedback and the raw evidence it names.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from infragent.probes.feedback import Feedback
from infragent.report.page import bars, chip, embedded_bytes, fmt, page, table, timeline, trace_link
from infragent.report.serving_views import LATENCIES, add_cdf_samples, cdf_points
from infragent.report.svg import BASELINE_COLOR, BEST_COLOR, Guide, Series, chart, e
from infragent.report.trace_view import trace_view
from infragent.trace_model import TraceFormatError


def write_probe_page(feedback: Feedback, output: str | Path) -> Path:
    """Draw one probe's Feedback to output; return its path."""
    output = Path(output)
    output.write_text(render_probe_page(feedback.to_dict()))
    return output


def render_probe_page(fb: dict[str, Any]) -> str:
    """The page: the verdict and finding, the numbers with their CIs, then what this kind of probe draws."""
    numbers = fb.get("numbers", {})
    rows = [f"<tr><td>{e(name)}</td><td class='num'>{fmt(m.get('value'))}</td><td class='num'>"
            + (f"[{fmt(m.get('ci_low'))}, {fmt(m.get('ci_high'))}]" if m.get("ci_low") is not None else "")
            + f"</td><td>{e(m.get('unit', ''))}</td></tr>" for name, m in numbers.items() if isinstance(m, dict)]
    summary = (f'<p class="big">{chip(fb["verdict"], fb["verdict"].upper())} {e(fb["finding"])}</p>'
               + table(["number", "value", "CI", "unit"], rows, css="numbers"))
    drawn = {"loadgen": _loadgen, "analyze": lambda f: _gpu(f) + _analyze(f), "bench": _bench}.get(
        fb["probe"], lambda _: [])(fb)
    evidence = "".join(f'<li><a href="{e(Path(ev["path"]).resolve().as_uri())}">{e(ev["path"])}</a> '
                       f'{e(ev.get("description", ""))}</li>' for ev in fb.get("evidence", []) if ev.get("path"))
    sections = [("result", "Result", summary), *drawn,
                ("evidence", "Evidence", f"<ul>{evidence}</ul>" if evidence else '<p class="muted">none</p>')]
    return page(f"infragent {fb['probe']}: {fb['verdict']}", e(fb["finding"][:200]), sections)


def _evidence_json(fb: dict[str, Any]) -> dict[str, Any] | None:
    for ev in fb.get("evidence", []):
        try:
            return json.loads(Path(ev["path"]).read_text())
        except (OSError, ValueError, KeyError):
            continue
    return None


def _loadgen(fb: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Latency CDFs per bucket from the raw records, and each repeat's throughput."""
    result = _evidence_json(fb)
    if result is None:
        return [("latency", "Latency CDFs", '<p class="muted">the raw records file is gone</p>')]
    cdfs: dict[str, dict[str, dict[str, list[float]]]] = {}
    add_cdf_samples(cdfs, result, result.get("config", {}).get("scenario") or "run", "measured")
    out = []
    for metric in LATENCIES:
        charts = [chart(f"{metric} · {group}", [Series(f"measured (n={len(s['measured'])})",
                                                       *cdf_points(s["measured"]), "step", BEST_COLOR)],
                        f"{metric} (ms)", "fraction of requests ≤ x", "cdf") for group, s in cdfs.get(metric, {}).items()]
        out.append(f'<h3>{e(metric)}: {e(LATENCIES[metric])}</h3><div class="charts">{"".join(charts)}</div>')
    runs = result.get("runs", [])
    tok = [run["metrics"].get("output_throughput", math.nan) for run in runs]
    per_repeat = chart("Output tok/s per repeat", [Series("repeats", list(range(len(tok))), tok, "points", BEST_COLOR,
                                                          tips=[f"repeat {i}: {t:.4g} tok/s" for i, t in enumerate(tok)])],
                       "repeat", "output tok/s", "repeats")
    return [("latency", "Latency CDFs", "".join(out)), ("repeats", "Repeats", per_repeat)]


def _analyze(fb: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Where the trace's time goes, a timeline excerpt, and the file for Perfetto."""
    source = fb.get("details", {}).get("source")
    if not source or not Path(source).is_file():
        return [("trace", "Where the time goes", '<p class="muted">the trace file is gone</p>')]
    try:
        t = trace_view(source, source)
    except (TraceFormatError, ValueError, OSError) as err:
        return [("trace", "Where the time goes", f'<p class="warn">{e(str(err)[:300])}</p>')]
    spans = [(r["key"], r["share"], f"{r['exclusive_ns'] / 1e6:.1f} ms self, {r['share']:.0%}") for r in t.top_spans]
    phases = [(r["key"], r["share"], f"{r['share']:.0%}") for r in t.by_phase]
    threads = [(r["key"], r["share"], f"{r['share']:.0%}") for r in t.by_track]
    body = (trace_link(t.path, "infragent analyze") + (embedded_bytes(t.path) if t.embedded else "")
            + bars(spans, "Top spans by self time") + bars(phases, "By phase") + bars(threads, "By thread")
            + f"<h3>Timeline excerpt ({t.excerpt_ms:.2f} ms)</h3>" + timeline(t.excerpt, t.excerpt_ms))
    return [("trace", "Where the time goes", body)]


def _gpu(fb: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A GPU trace: each device's idle time by cause, the host's side of it, work by kind, top kernels, steps."""
    gpu = fb.get("details", {}).get("gpu")
    if not gpu:
        return []
    body = ""
    for d in gpu["idle"]:
        idle = max(d["idle_ns"], 1)
        host = max(sum(d["host_parts"].values()), 1)
        body += (bars([(k, v / idle, f"{v / 1e6:.2f} ms, {v / idle:.0%}") for k, v in d["by_cause"].items() if v],
                      f"GPU {d['device']}: idle {d['idle_ns'] / 1e6:.1f} of {d['window_ns'] / 1e6:.1f} ms, by cause")
                 + bars([(k, v / host, f"{v / 1e6:.2f} ms") for k, v in d["host_parts"].items() if v],
                        "The host's side of the host-caused idle time"))
    kernels = gpu["kernels"]
    body += bars([(k["kind"], k["share"], f"{k['total_ns'] / 1e6:.2f} ms, {k['count']} calls") for k in kernels["kinds"]],
                 "GPU work by kind")
    body += "<h3>Top kernels</h3>" + table(
        ["kernel", "kind", "source", "calls", "total ms", "median µs", "share"],
        [f"<tr><td title='{e(k['name'])}'>{e(k['short'])}</td><td>{e(k['kind'])}</td><td>{e(k['source'])}</td>"
         f"<td class='num'>{k['count']}</td><td class='num'>{k['total_ns'] / 1e6:.3f}</td>"
         f"<td class='num'>{k['median_ns'] / 1e3:.1f}</td><td class='num'>{k['share']:.1%}</td></tr>"
         for k in kernels["top"]], sortable=True)
    if gpu["steps"]:
        body += "<h3>Steps</h3>" + table(["step", "name", "mode", "work", "GPU window ms", "idle", "copy under compute"], [
            f"<tr><td class='num'>{s['index']}</td><td>{e(s['name'])}</td><td>{e(s['mode'])}</td>"
            f"<td class='num'>{s['work']}</td><td class='num'>{s['window_ns'] / 1e6:.2f}</td>"
            f"<td class='num'>{s['idle_share']:.0%}</td><td class='num'>"
            + ("" if s["copy_overlap_share"] is None else f"{s['copy_overlap_share']:.0%}") + "</td></tr>"
            for s in gpu["steps"]], sortable=True)
    return [("gpu", "The GPU", body)]


def _bench(fb: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every timed pair (A and B per call) and the per-pair ratio's distribution against the reported CI."""
    raw = fb.get("details", {}).get("raw", {})
    a, b = raw.get("a_ns", []), raw.get("b_ns", [])
    if not a:
        return [("samples", "Samples", '<p class="muted">no timed pairs</p>')]
    locality = fb.get("locality", {})
    name_a, name_b = locality.get("a") or "A", locality.get("b") or "B"
    pairs = chart("Time per call, pair by pair", [
        Series(f"A: {name_a}", list(range(len(a))), [x / 1e3 for x in a], "points", BASELINE_COLOR),
        Series(f"B: {name_b}", list(range(len(b))), [x / 1e3 for x in b], "points", BEST_COLOR)],
        "pair", "µs per call", "pairs", width=620)
    ratios = np.asarray(b[:len(a)], float) / np.maximum(np.asarray(a[:len(b)], float), 1.0)
    ratio = fb.get("numbers", {}).get("ratio", {})
    guides = [Guide("x", ratio[k], f"CI {'low' if k == 'ci_low' else 'high'}") for k in ("ci_low", "ci_high")
              if ratio.get(k) is not None]
    spread = chart("B/A per pair", [Series(f"pairs (n={ratios.size})", *cdf_points(ratios.tolist()), "step",
                                           BEST_COLOR)], "B/A time ratio", "fraction of pairs ≤ x", "ratios", guides)
    contention = fb.get("details", {}).get("contention")
    note = (f'<p class="warn contention">the machine was busy: {e(json.dumps(contention)[:400])}</p>'
            if contention and contention.get("contended") else "")
    return [("samples", "Samples", note + f'<div class="charts">{pairs}{spread}</div>')]
