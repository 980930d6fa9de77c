"""`infragent report RUN`: a run's data (data.py) drawn as one page: did it win and against which criteria,
what it tried and why, where the time goes, whether the numbers can be trusted.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from infragent.lab.criteria import limit_text
from infragent.lab.ledger import Ledger
from infragent.report.data import RunReport, run_report
from infragent.report.page import bars, chip, diff_block, embedded_bytes, fmt, page, table, timeline, trace_link
from infragent.report.serving_views import LATENCIES, cdf_points
from infragent.report.svg import BASELINE_COLOR, BEST_COLOR, Guide, Series, chart, e


def write_report(ledger: Ledger, run_id: int, output: str | Path, trace_path: str | Path | None = None) -> Path:
    """Build and write a run's report; return its path."""
    output = Path(output)
    output.write_text(render_report(run_report(ledger, run_id, trace_path)))
    return output


def render_report(r: RunReport, live: str = "", served: bool = False) -> str:
    """The whole page for one run. live: a panel that follows a running run (the dashboard's); served: links
    point at the dashboard's /artifacts/SHA instead of files on this disk."""
    run, env = r.run, r.environment
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created"]))
    subtitle = (f"{e(run.get('spec_path') or '')} · started {when} · commit {e(str(env.get('git_commit') or 'n/a')[:12])}"
                f"{' (dirty)' if env.get('git_dirty') else ''}")
    sections = [("live", "Live", live)] if live else []
    sections += [("headline", "Result", headline_html(r)), ("trials", "Trials", trials_html(r))]
    if r.progress:
        sections.append(("progress", "Search progress", progress_html(r)))
    if r.points:
        sections.append(("pareto", "Trade-off: throughput against tail latency", pareto_html(r)))
    sections += [("latency", "Latency CDFs: baseline against best", latency_html(r)),
                 ("trace", "Where the time goes", trace_html(r, served)),
                 ("hypotheses", "Hypotheses", chains_html(r))]
    patches = [t for t in r.trials if t["patch"]]
    if patches or any(j.get("phase") == "kernel" for t in r.trials for j in t["judgements"]):
        sections.append(("evidence", "Kernel and code evidence per candidate", evidence_html(r)))
    sections += [("environment", "Environment and trust", environment_html(r)),
                 ("probes", "Every probe record", probes_html(r, served))]
    return page(f"Run {run['id']}: {run['kind']} — {run['status']}", subtitle, sections)


def criterion_row(j: dict[str, Any]) -> str:
    """One judgement: where (scenario, phase, bucket), the estimate, its CI, the limit, the verdict, why."""
    lo, hi = j["ci"]
    if j.get("regression") is not None:
        estimate, ci = f"regression {j['regression']:+.1%}", f"[{lo:+.1%}, {hi:+.1%}]"
    else:
        estimate, ci = fmt(j["value"]), f"[{fmt(lo)}, {fmt(hi)}]"
    ci += f" ({j['confidence']:.0%})" if j.get("confidence") else ""
    rule = j.get("rule") or ("max_regression" if j.get("regression") is not None else "")
    limit = limit_text(rule, j["limit"]) if j.get("limit") is not None else "n/a"
    cells = [e(j.get("scenario") or "-"), e(j["phase"]), e(j["bucket"]), e(j["metric"]), estimate, e(ci), e(limit),
             e(j["verdict"].upper()), e(j["message"])]
    classes = ["", "", "", "metric", "num", "num", "", "v", "why"]
    return (f'<tr class="verdict-{e(j["verdict"])}">' + "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>"
                                                                for c, v in zip(classes, cells)) + "</tr>")


def _measure_text(m: dict[str, Any] | None) -> str:
    if not m:
        return "n/a"
    ci = f" [{fmt(m.get('ci_low'))}, {fmt(m.get('ci_high'))}]" if m.get("ci_low") is not None else ""
    return f"{fmt(m.get('value'))}{ci}"


def headline_html(r: RunReport) -> str:
    """Baseline against best, the verdict per criterion, and why the run stopped."""
    h = r.headline
    if h.kind != "optimize":
        badge = '<span class="badge measure">MEASURED</span> the baseline, judged against the spec\'s criteria'
    elif h.best is not None:
        change = h.best.get("patch_summary") or h.best["knobs"]
        badge = (f'<span class="badge win">WIN</span> best: <a href="#trial-{h.best["trial"]}">trial '
                 f'{h.best["trial"]}</a> {e(change)} against baseline {e(h.baseline_knobs)}')
    elif r.run["status"] == "running":
        badge = f'<span class="badge measure">RUNNING</span> no win yet over the baseline {e(h.baseline_knobs)}'
    else:
        badge = f'<span class="badge nowin">NO WIN</span> the baseline {e(h.baseline_knobs)} is kept'
    parts = [f'<p class="big">{badge}</p>']
    if h.objective:
        ratio = h.objective.get("objective_ratio")
        parts.append(f'<p class="big objective">{e(r.objective_label)}: baseline '
                     f'{_measure_text(h.objective.get("objective_baseline"))} → '
                     f'{_measure_text(h.objective.get("objective_candidate"))}'
                     + (f' (x{fmt(ratio.get("value"))} [{fmt(ratio.get("ci_low"))}, {fmt(ratio.get("ci_high"))}] over '
                        f'twins)' if ratio else "") + _measured_on(r, h.trial) + "</p>")
    if h.stopped:
        parts.append(f'<p class="stopped">stopped: {e(h.stopped)}</p>')
    passed = sum(j["verdict"] == "pass" for j in h.judgements)
    parts.append(f'<h3 id="criteria">Criteria ({e(h.judged)}): {passed} of {len(h.judgements)} pass</h3>')
    rows = [criterion_row(j) for j in h.judgements] or ['<tr><td colspan="9">no criteria were judged</td></tr>']
    parts.append(table(["scenario", "phase", "bucket", "metric", "estimate", "CI", "limit", "verdict", "why"], rows,
                       css="criteria"))
    return "".join(parts)


def _measured_on(r: RunReport, trial: int | None) -> str:
    """", both measured on node N" for a trial that ran on a Ray node (its baseline was its twin there)."""
    node = next((t["node"] for t in r.trials if t["trial"] == trial and t.get("node")), None)
    return f", both measured on node {e(node)}" if node else ""


def trials_html(r: RunReport) -> str:
    """One sortable row per trial: the change, each gate's verdict and cost, the objective, the outcome."""
    if not r.trials:
        return ('<p class="muted">no trial has finished yet</p>' if r.run["status"] == "running" else
                '<p class="muted">no trials: this run measured the baseline only</p>')
    best = r.headline.best["trial"] if r.headline.best else None
    recorded = {p["key"].split("/")[1] for p in r.probes if p["key"].startswith("trial/")}
    on_nodes = any(t.get("node") for t in r.trials)
    rows = []
    for t in r.trials:
        change = t["patch_summary"] or ", ".join(f"{k}={v}" for k, v in t["knobs"].items()) or "-"
        gates = "".join(chip(g["verdict"], f"{g['gate']} {g['verdict']}" + (f" {g['cost_s']:.0f}s" if g["cost_s"] else ""),
                             f"#probe-{g['key']}", g["finding"][:300]) for g in t["gates"]) or "-"
        ci = t["objective_ci"]
        objective = fmt(t["objective"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci and ci[0] is not None else "")
        outcome = "accepted" if t["accepted"] else t["status"]
        cls = " ".join(c for c in ("accepted" if t["accepted"] else "", "best-row" if t["trial"] == best else "") if c)
        number = (f'<a href="#records-trial-{t["trial"]}" title="its probe records">{t["trial"]}</a>'
                  if str(t["trial"]) in recorded else str(t["trial"]))
        node = f'<td>{e(t["node"] or "-")}</td>' if on_nodes else ""
        rows.append(f'<tr id="trial-{t["trial"]}" class="{cls}"><td class="num" data-value="{t["trial"]}">{number}'
                    f'</td><td>{e(t["proposer"])}</td><td>{e(change)}</td><td>{e(t["hypothesis"] or "-")}'
                    f'</td><td>{gates}</td><td class="num" data-value="{t["objective"] if t["objective"] is not None else -1e300}">'
                    f'{objective}</td><td class="num" data-value="{t["cost_s"]:.3f}">{t["cost_s"]:.0f}</td>'
                    f'<td>{e(outcome)}</td>{node}<td>{e(t["why"][:400])}</td></tr>')
    return ('<p class="muted">click a column to sort; a trial links to its probe records, a gate to its own'
            + ("; node: where the trial and its twin baseline were measured" if on_nodes else "") + '</p>'
            + table(["trial", "proposer", "change", "hypothesis", "gates", "objective [CI]", "cost s", "outcome"]
                    + (["node"] if on_nodes else []) + ["why"], rows, sortable=True, css="trials"))


def progress_html(r: RunReport) -> str:
    """Objective per trial (accepted or not), the best so far, the baseline's level."""
    done = [p for p in r.progress if p["objective"] is not None]
    series = [Series("accepted", [p["trial"] for p in done if p["feasible"]],
                     [p["objective"] for p in done if p["feasible"]], "points", "#16a34a",
                     tips=[f"trial {p['trial']}: {p['objective']:.4g}" for p in done if p["feasible"]],
                     classes=["feasible"] * sum(p["feasible"] for p in done)),
              Series("rejected", [p["trial"] for p in done if not p["feasible"]],
                     [p["objective"] for p in done if not p["feasible"]], "points", "#dc2626",
                     tips=[f"trial {p['trial']}: {p['objective']:.4g}" for p in done if not p["feasible"]],
                     classes=["infeasible"] * sum(not p["feasible"] for p in done))]
    best = [p for p in r.progress if p["best_so_far"] is not None]
    if best:
        series.append(Series("best", [p["trial"] for p in best], [p["best_so_far"] for p in best], "step", BEST_COLOR))
    base = (r.headline.objective.get("objective_baseline") or {}).get("value")
    if base is not None and r.progress:
        series.append(Series("baseline", [r.progress[0]["trial"], r.progress[-1]["trial"]], [base, base], "line",
                             BASELINE_COLOR, dashed=True))
    return chart("Objective over trials", series, "trial", r.objective_label, "progress", width=760,
                 empty="no trial reached an objective")


def pareto_html(r: RunReport) -> str:
    """Throughput against TTFT p99 and TPOT p99: every trial, the front, the baseline, the best, the SLOs."""
    best, name = r.headline.trial, "best" if r.headline.best else "closest"
    charts = []
    for metric, label, front_key in (("ttft_p99_ms", "TTFT p99 (ms)", "front_ttft"),
                                     ("tpot_p99_ms", "TPOT p99 (ms)", "front_tpot")):
        trials = [p for p in r.points if p["side"] == "trial" and math.isfinite(p[metric])]
        front = sorted((p for p in trials if p.get(front_key)), key=lambda p: p[metric])
        base = [p for p in r.points if p["side"] == "baseline"]
        top = [p for p in trials if p["trial"] == best]
        tip = lambda p: f"trial {p['trial']}: {p['output_tok_s']:.4g} tok/s, {label} {p[metric]:.4g}"  # noqa: E731
        series = [Series("trials", [p[metric] for p in trials], [p["output_tok_s"] for p in trials], "points",
                         "#9ca3af", tips=[tip(p) for p in trials],
                         classes=["feasible" if p["feasible"] else "infeasible" for p in trials]),
                  Series("Pareto front", [p[metric] for p in front], [p["output_tok_s"] for p in front], "line",
                         "#16a34a"),
                  Series("baseline", [p[metric] for p in base], [p["output_tok_s"] for p in base], "points",
                         BASELINE_COLOR, tips=["baseline (measured beside the best trial)"] * len(base)),
                  Series(name, [p[metric] for p in top], [p["output_tok_s"] for p in top], "points", BEST_COLOR,
                         tips=[tip(p) for p in top])]
        guides = [Guide("x", r.slos_ms[metric], f"SLO {r.slos_ms[metric]:g} ms")] if metric in r.slos_ms else []
        charts.append(chart(f"Output tok/s against {label}", series, label, "output tok/s", "pareto", guides))
    return ('<p class="muted">up and to the left is better; faded points failed a criterion</p><div class="charts">'
            + "".join(charts) + "</div>")


def latency_html(r: RunReport) -> str:
    """One CDF per latency metric and (scenario, bucket): baseline and best overlaid."""
    if not r.cdfs:
        return '<p class="muted">no loadgen records in this run</p>'
    out = []
    for metric in LATENCIES:
        groups = r.cdfs.get(metric, {})
        charts = []
        for group, sides in groups.items():
            series = []
            for side, color, dashed in (("baseline", BASELINE_COLOR, True), ("best", BEST_COLOR, False),
                                        ("closest", BEST_COLOR, False)):
                if sides.get(side):
                    xs, ys = cdf_points(sides[side])
                    series.append(Series(f"{side} (n={len(sides[side])})", xs, ys, "step", color, dashed))
            charts.append(chart(f"{metric} · {group}", series, f"{metric} (ms)", "fraction of requests ≤ x", "cdf"))
        if charts:
            out.append(f'<h3>{e(metric)}: {e(LATENCIES[metric])}</h3><div class="charts">{"".join(charts)}</div>')
    return "".join(out)


def trace_html(r: RunReport, served: bool = False) -> str:
    """The baseline's trace: top spans, phases, threads, a timeline excerpt, and the file for Perfetto."""
    t = r.trace
    if t is None:
        return ('<p class="muted">no trace in this run: the loop traces the baseline when its diagnosis runs; '
                'pass <code>--trace FILE</code> to show another</p>')
    spans = [(row["key"], row["share"], f"{row['exclusive_ns'] / 1e6:.1f} ms self, {row['count']} calls, "
              f"{row['share']:.0%}") for row in t.top_spans]
    phases = [(row["key"], row["share"], f"{row['exclusive_ns'] / 1e6:.1f} ms, {row['share']:.0%}") for row in t.by_phase]
    threads = [(row["key"], row["share"], f"{row['exclusive_ns'] / 1e6:.1f} ms, {row['share']:.0%}") for row in t.by_track]
    href = f"/artifacts/{Path(t.path).name}" if served and t.stored else None
    return (f'<p>from <code>{e(t.label)}</code>, {t.events} events</p>'
            + trace_link(t.path, f"infragent {t.label}", href)
            + (embedded_bytes(t.path) if t.embedded else "")
            + bars(spans, "Top spans by self time") + bars(phases, "By phase") + bars(threads, "By thread")
            + f"<h3>Timeline excerpt: the first {len(t.excerpt)} spans ({t.excerpt_ms:.2f} ms)</h3>"
            + timeline(t.excerpt, t.excerpt_ms))


def chains_html(r: RunReport) -> str:
    """Each hypothesis: claim → probe → verdict → decision."""
    rows = []
    for c in r.chains:
        verdict = {"supported": "pass", "refuted": "fail"}.get(c["status"], "inconclusive")
        probe = (f'<a href="#probe-{e(c["settled_by"])}">{e(c["settled_by"])}</a>: {e(c["probe_finding"] or "")}'
                 if c["settled_by"] else f"{e(c['probe'])} (not run)")
        rows.append(f'<tr class="verdict-{verdict}"><td>{e(c["key"])}: {e(c["claim"])}</td><td>{probe}</td>'
                    f'<td class="v">{e(c["status"].upper())}</td><td>{e(c["decision"])}</td></tr>')
    return table(["claim", "probe", "verdict", "decision"], rows or ['<tr><td colspan="4">no hypotheses</td></tr>'],
                 css="chains")


def evidence_html(r: RunReport) -> str:
    """Per candidate its check, roofline and bench findings; the accepted patch as a diff."""
    out = []
    for t in r.trials:
        gates = [g for g in t["gates"] if g["probe"] in ("check", "bench", "roofline", "tests", "step_bench")]
        if not gates and not t["patch"]:
            continue
        items = "".join(f'<li>{chip(g["verdict"], g["gate"], "#probe-" + g["key"])} {e(g["finding"][:600])}</li>'
                        for g in gates)
        out.append(f'<h3>trial {t["trial"]}: {"accepted" if t["accepted"] else e(t["status"])}</h3><ul>{items}</ul>')
        if t["patch"]:
            out.append(diff_block(t["patch"]) if t["accepted"] else
                       f"<details><summary>its patch ({e(t['patch_summary'])})</summary>{diff_block(t['patch'])}</details>")
    return "".join(out) or '<p class="muted">no kernel or code evidence</p>'


def environment_html(r: RunReport) -> str:
    """Machine, CPU flags, commit, packages, and which probes measured on a busy machine."""
    env = r.environment
    rows = [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in (
        ("CPU", env.get("cpu")), ("cores", env.get("cores")), ("CPU flags", " ".join(env.get("cpu_flags", [])) or "n/a"),
        ("GPU", env.get("gpu") or "none"), ("platform", env.get("platform")), ("python", env.get("python")),
        ("commit", f"{env.get('git_commit')}{' + uncommitted diff ' + str(env.get('git_diff_sha256'))[:12] if env.get('git_dirty') else ''}"),
        ("packages", ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())))]
    contended = [p for p in r.probes if p["contended"]]
    trust = (f'<p class="warn contention">{len(contended)} of {len(r.probes)} probe records measured on a busy '
             f'machine: ' + ", ".join(f'<a href="#probe-{e(p["key"])}">{e(p["key"])}</a>' for p in contended[:40])
             + ("…" if len(contended) > 40 else "") + "</p>" if contended else
             f'<p class="contention">no probe record reports contention ({len(r.probes)} records)</p>')
    notes = "".join(f'<p class="warn">{e(n)}</p>' for n in r.notes)
    return table(["", ""], rows, css="environment") + trust + notes


def _evidence_href(ev: dict[str, Any], served: bool) -> str:
    if served and ev.get("sha256"):
        return f"/artifacts/{ev['sha256']}"
    path = ev.get("stored") or ev["path"]
    return Path(path).as_uri() if path.startswith("/") else path


def probes_html(r: RunReport, served: bool = False) -> str:
    """Every probe record: key, probe, verdict, cost, contention, finding, evidence files."""
    rows, anchored = [], set()
    for p in r.probes:
        trial = p["key"].split("/")[1] if p["key"].startswith("trial/") else None
        anchor = f'<a id="records-trial-{e(trial)}"></a>' if trial is not None and trial not in anchored else ""
        anchored.add(trial)
        files = " ".join(f'<a href="{e(_evidence_href(ev, served))}">{e(ev["description"] or "file")}</a>'
                         for ev in p["evidence"] if ev["path"])
        machine = " ".join(filter(None, [p.get("node"), "busy" if p["contended"] else ""]))  # node: a Ray node's
        rows.append(f'<tr id="probe-{e(p["key"])}" class="verdict-{e(p["verdict"])}"><td>{e(p["key"])}</td>'
                    f'<td>{e(p["probe"])}{anchor}</td><td class="v">{e(p["verdict"].upper())}</td>'
                    f'<td class="num">{fmt(p["cost_s"], 3)}</td><td>{e(machine)}</td>'
                    f'<td>{e(p["finding"][:800])}</td><td>{files}</td></tr>')
    return (f"<details open><summary>{len(rows)} records</summary>"
            + table(["key", "probe", "verdict", "cost s", "machine", "finding", "evidence"], rows, sortable=True,
                    css="probes") + "</details>")
