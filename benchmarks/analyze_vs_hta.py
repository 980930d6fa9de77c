"""Our trace analysis against Holistic Trace Analysis (HTA 0.5) on the same Kineto traces: the same answers
(temporal breakdown: idle / compute / non-compute GPU time; on the synthetic trace also comm/compute overlap),
wall time of the whole process and peak memory of each. Two modes:

Synthetic (default): one generated trace (benchmarks/kineto_synth.py) of --kernels kernels. Each run is a fresh
process doing exactly: load the trace, temporal breakdown, comm/compute overlap.

    PYTHONPATH=src .venv/bin/python benchmarks/analyze_vs_hta.py [--kernels 1000000] [--hta-runs 2] [--our-runs 5]

Real (--real DIR, default DIR tests/data/h200): the H200 traces in DIR, with the truth from DIR/README.md, plus
the largest of them made --times (10) times longer by benchmarks/kineto_concat.py. Per trace, --runs (3) fresh
processes per tool, alternating (ours, HTA, then HTA, ours, ...). Our process loads the trace, runs the whole
`analyze()` (what `infragent analyze` gives the user) and, separately, `temporal_breakdown()`; HTA's process
runs TraceAnalysis + get_temporal_breakdown + get_idle_time_breakdown (the last reported as extra). An HTA
crash is recorded with its message (the assertion line), never stops the benchmark. Prints the answers
against the truth, wall time and peak memory per tool, the HTA/ours ratios with their min..max interval over
the runs, and checks the K-times trace against the original (compute and non-compute exactly K times, idle
as predicted from the span between copies). Raw samples go to benchmarks/results/analyze_vs_hta_real.json.

    PYTHONPATH=src .venv/bin/python benchmarks/analyze_vs_hta.py --real tests/data/h200 --runs 3

Peak memory is the largest sum of PSS over the run's process tree (our loader may fork a child that shares
the file's pages; PSS counts shared pages once), sampled every 20 ms. Each run also records the load average
and how many cores other processes used meanwhile (/proc/stat busy time minus our processes' CPU time), so a
disturbed run shows; in real mode each run first waits (up to --wait-quiet, 20 s) for the machine to be quiet,
and the ratios are also given over the quiet runs only (others <= 0.25 core). Needs HTA: pip install -e .[hta]
(or `pip install --no-deps holistictraceanalysis` plus pandas, plotly, pydot, networkx).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from kineto_concat import concat  # noqa: E402
from kineto_synth import write  # noqa: E402

OURS = """
import json, sys
from infragent.analysis.trace_load import load_columns
from infragent.analysis.gpu_time import temporal_breakdown
from infragent.analysis.gpu_overlap import comm_comp_overlap
c = load_columns(sys.argv[1])
tb = temporal_breakdown(c)
print(json.dumps({"overlap": comm_comp_overlap(c), "idle": tb.pct("idle"), "compute": tb.pct("compute"),
                  "non_compute": tb.pct("non_compute")}))
"""
HTA = """
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
o = a.get_comm_comp_overlap(visualize=False).iloc[0]
t = a.get_temporal_breakdown(visualize=False).iloc[0]
print(json.dumps({"overlap": float(o["comp_comm_overlap_pctg"]), "idle": float(t["idle_time_pctg"]),
                  "compute": float(t["compute_time_pctg"]), "non_compute": float(t["non_compute_time_pctg"])}))
"""

# Real mode. Ours: the whole analysis the user gets, then the temporal breakdown on its own (same columns).
OURS_REAL = """
import json, sys, time
t0 = time.perf_counter()
from infragent.analysis.trace_load import load_columns
from infragent.analysis.gpu_time import temporal_breakdown
from infragent.probes.analyze import analyze
t1 = time.perf_counter()
c = load_columns(sys.argv[1])
t2 = time.perf_counter()
fb = analyze(c)
t3 = time.perf_counter()
tb = temporal_breakdown(c)
t4 = time.perf_counter()
print(json.dumps({
    "idle": tb.pct("idle"), "compute": tb.pct("compute"), "non_compute": tb.pct("non_compute"),
    "ns": {"window": tb.kernel_ns, "idle": tb.idle_ns, "compute": tb.compute_ns, "non_compute": tb.non_compute_ns},
    "analyze": {"verdict": fb.verdict, "numbers": {k: m.value for k, m in fb.numbers.items()},
                "finding": fb.finding[:400]},
    "events": len(c),
    "stage_s": {"import": t1 - t0, "load": t2 - t1, "analyze": t3 - t2, "temporal_breakdown": t4 - t3}}))
"""
# HTA: each stage caught on its own, so a crash in one still reports the others and where it crashed.
HTA_REAL = """
import json, logging, sys, time, traceback, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
def crash(e):
    last = traceback.extract_tb(e.__traceback__)[-1]
    return (f"{type(e).__name__}{': ' + str(e) if str(e) else ''} "
            f"(`{last.line}` at {Path(last.filename).name}:{last.lineno})")
out, t0 = {"stage_s": {}}, time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
out["stage_s"]["import"] = t1 - t0
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
out["stage_s"]["load"] = t2 - t1
try:
    t = a.get_temporal_breakdown(visualize=False).iloc[0]
    out.update(idle=float(t["idle_time_pctg"]), compute=float(t["compute_time_pctg"]),
               non_compute=float(t["non_compute_time_pctg"]))
except Exception as e:
    out["temporal_error"] = crash(e)
t3 = time.perf_counter()
out["stage_s"]["temporal_breakdown"] = t3 - t2
try:
    df = a.get_idle_time_breakdown(visualize=False)[0]
    by = df.groupby("idle_category")["idle_time"].sum()
    out["idle_breakdown_us"] = {str(k): float(v) for k, v in by.items()}
except Exception as e:
    out["idle_breakdown_error"] = crash(e)
out["stage_s"]["idle_time_breakdown"] = time.perf_counter() - t3
print(json.dumps(out))
"""
PARTS = ("idle", "compute", "non_compute")
QUIET = 0.25  # a run is quiet when other processes used at most this many cores meanwhile
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _busy_s() -> float:
    """CPU seconds all cores of the machine spent busy since boot (user, nice, system, irq, softirq, steal)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / CLK_TCK


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(most_s: float, cores: float = QUIET) -> float:
    """Wait (up to most_s) until other processes use under `cores` cores over half a second; seconds waited."""
    start = time.perf_counter()
    while True:
        busy0 = _busy_s()
        time.sleep(0.5)
        if (_busy_s() - busy0) / 0.5 < cores or time.perf_counter() - start >= most_s:
            return time.perf_counter() - start


def run(tool: str, target: Path, code: str | None = None, strict: bool = True, quiet_s: float = 0.0) -> dict:
    """One fresh process: wall seconds, peak PSS of its tree (GB), CPU seconds, others' cores, its answers.
    strict: a failed process stops the benchmark (synthetic mode); otherwise it is recorded with its stderr.
    quiet_s: first wait up to this long for the machine to be quiet."""
    code = code or (OURS if tool == "ours" else HTA)
    waited = wait_quiet(quiet_s) if quiet_s > 0 else 0.0
    load_before, busy0, own0 = _loadavg(), _busy_s(), time.process_time()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_pss_kb(p) for p in _tree(proc.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    others = max(0.0, _busy_s() - busy0 - cpu - (time.process_time() - own0)) / wall
    r = {"tool": tool, "target": str(target), "wall_s": wall, "peak_gb": peak[0] / 1e6, "cpu_s": cpu,
         "others_cores": others, "waited_s": waited, "load_before": load_before, "load_after": _loadavg(),
         "rc": proc.returncode}
    if proc.returncode:
        if strict:
            raise SystemExit(f"{tool} failed ({proc.returncode}):\n{err[-3000:]}")
        r["error"] = err.strip()[-3000:] or f"exit status {proc.returncode}"
        return r
    r["answers"] = json.loads(out.strip().splitlines()[-1])
    return r


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def synthetic(args: argparse.Namespace) -> None:
    """Generate the trace if needed, alternate the tools, print times, memory, ratio and agreement."""
    folder = Path(args.dir) / f"k{args.kernels}"
    trace = folder / "rank0.json"
    if not trace.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write(trace, args.kernels)
    print(f"trace: {trace} ({trace.stat().st_size / 1e6:.0f} MB, {3 * args.kernels} events)", flush=True)
    plan = ["ours"] * args.our_runs
    for k in range(args.hta_runs):  # spread HTA's runs among ours
        plan.insert(min(len(plan), (k + 1) * (args.our_runs // (args.hta_runs + 1) + 1) + k), "hta")
    runs = []
    for tool in plan:
        r = run(tool, trace if tool == "ours" else folder)
        runs.append(r)
        print(f"  {tool:4s} {r['wall_s']:7.2f} s  peak {r['peak_gb']:.2f} GB  {r['answers']}", flush=True)
    ours = [r for r in runs if r["tool"] == "ours"]
    hta = [r for r in runs if r["tool"] == "hta"]
    o_wall, h_wall = med([r["wall_s"] for r in ours]), med([r["wall_s"] for r in hta])
    o_mem, h_mem = max(r["peak_gb"] for r in ours), max(r["peak_gb"] for r in hta)
    lo = min(r["wall_s"] for r in hta) / max(r["wall_s"] for r in ours)
    hi = max(r["wall_s"] for r in hta) / min(r["wall_s"] for r in ours)
    print(f"wall time: ours median {o_wall:.2f} s, HTA median {h_wall:.1f} s -> {h_wall / o_wall:.1f}x faster "
          f"(range over runs {lo:.1f}x-{hi:.1f}x; goal >= 25x)")
    print(f"peak memory: ours {o_mem:.2f} GB, HTA {h_mem:.2f} GB -> {o_mem / h_mem:.0%} of HTA's (goal <= 50%)")
    worst = max(abs(r["answers"][k] - hta[0]["answers"][k]) for r in ours for k in hta[0]["answers"])
    print(f"agreement: largest difference {worst:.3f} percentage points (goal <= 0.1) "
          f"ours {ours[0]['answers']} HTA {hta[0]['answers']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"trace_mb": trace.stat().st_size / 1e6, "runs": runs}, indent=1))


# ---------------------------------------------------------------------------------------------- real mode

def read_truth(readme: Path) -> dict[str, dict]:
    """README table rows: file -> {"truth": (idle, compute, non_compute), "hta_readme": str}."""
    truth = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].endswith((".json", ".json.gz")):
            continue
        numbers = re.match(r"\s*([\d.]+)\s*/\s*([\d.]+)\s*/\s*([\d.]+)", cells[2])
        if numbers:
            truth[cells[0]] = {"truth": tuple(float(x) for x in numbers.groups()), "hta_readme": cells[3]}
    return truth


def _hta_dir(trace: Path, folder: Path) -> Path:
    """HTA reads a directory of per-rank traces: one folder per trace, holding a link to it."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / trace.name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(trace.resolve())
    return folder


def _interval(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Ratio of medians, and the min..max interval over the runs (worst case each way)."""
    return med(num) / med(den), min(num) / max(den), max(num) / min(den)


def _fmt3(v: tuple | list | None) -> str:
    return " / ".join(f"{x:.1f}" for x in v) if v else "-"


def _src_state() -> dict:
    """The code measured: HEAD and a hash of src/ as it is on disk (the tree may hold uncommitted work)."""
    digest = hashlib.sha256()
    for p in sorted((ROOT / "src").rglob("*.py")):
        digest.update(str(p.relative_to(ROOT)).encode() + p.read_bytes())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"head": head.strip(), "src_sha256": digest.hexdigest()[:16], "src_uncommitted": bool(dirty.strip())}


def _cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def real(args: argparse.Namespace) -> None:
    """Both tools on every shared trace and on the K-times longest one; tables, ratios, JSON."""
    src = Path(args.real)
    truth = read_truth(src / "README.md")
    traces = sorted(src.glob("*.json.gz")) + sorted(src.glob("*.json"))
    work = Path(args.dir) / "real"
    os.environ.setdefault("INFRAGENT_ARTIFACTS", str(work / "artifacts"))  # analyze() writes its details there
    largest = max(traces, key=lambda p: p.stat().st_size)
    stem = largest.name.split(".json")[0]
    longer = work / f"{stem}_x{args.times}" / f"{stem}_x{args.times}.json.gz"
    made = concat(largest, longer, args.times, args.gap_us)
    targets = [(t.name, t) for t in traces] + [(longer.name, longer)]
    meta = {"cpu_model": _cpu_model(), "cores": os.cpu_count(),
            "loadavg_start": Path("/proc/loadavg").read_text().strip(),
            "code": _src_state(), "runs_per_tool": args.runs, "concat": made, "argv": sys.argv}
    print(f"CPU: {meta['cpu_model']} ({meta['cores']} cores); load average at start: {meta['loadavg_start']}")
    print(f"code: HEAD {meta['code']['head']}, src sha256 {meta['code']['src_sha256']}"
          f"{' (uncommitted changes in src/)' if meta['code']['src_uncommitted'] else ''}")
    print(f"{longer.name}: {largest.name} x{args.times} ({made['events_out']} events, shifted by "
          f"{made['shift_us'] / 1e3:.3f} ms = span {made['span_us'] / 1e3:.3f} ms + gap)", flush=True)
    runs = []
    for name, trace in targets:
        folder = _hta_dir(trace, work / "hta" / name.split(".json")[0])
        for i in range(args.runs):
            for tool in (("ours", "hta") if i % 2 == 0 else ("hta", "ours")):
                r = run(tool, trace if tool == "ours" else folder, OURS_REAL if tool == "ours" else HTA_REAL,
                        strict=False, quiet_s=args.wait_quiet)
                r["trace"] = name
                runs.append(r)
                a = r.get("answers", {})
                said = (_fmt3([a[k] for k in PARTS]) if "idle" in a else
                        f"crashed: {a.get('temporal_error') or r.get('error', '').splitlines()[-1:]}")
                print(f"  {name:40s} {tool:4s} {r['wall_s']:7.2f} s  peak {r['peak_gb']:.3f} GB  "
                      f"others {r['others_cores']:.2f} cores (waited {r['waited_s']:.1f} s)  {said}", flush=True)
    summary = summarize(runs, targets, truth, made, args.times)
    meta["loadavg_end"] = Path("/proc/loadavg").read_text().strip()
    meta["code_end"] = _src_state()
    if meta["code_end"] != meta["code"]:
        print(f"WARNING: src/ changed during the benchmark (now {meta['code_end']})")
    print(f"load average at end: {meta['loadavg_end']}")
    out = Path(args.json or ROOT / "benchmarks" / "results" / "analyze_vs_hta_real.json")
    out.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    print(f"raw samples: {out}")


def summarize(runs: list[dict], targets: list[tuple[str, Path]], truth: dict, made: dict, times: int) -> dict:
    """Print the answers table, the speed/memory table with ratios, the K-times check; return them."""
    by = {(name, tool): [r for r in runs if r["trace"] == name and r["tool"] == tool]
          for name, _ in targets for tool in ("ours", "hta")}
    result: dict = {"traces": {}}
    print("\nAnswers (GPU time %, idle / compute / non-compute; truth from the README)")
    print(f"{'trace':40s} {'truth':18s} {'ours':18s} {'ours-truth max':>14s}  {'HTA':18s} HTA idle-time breakdown")
    off_truth = []
    for name, _ in targets:
        ours = next((r for r in by[(name, "ours")] if "answers" in r), None)
        hta = next((r for r in by[(name, "hta")] if "answers" in r), None)
        t = truth.get(name, {}).get("truth")
        row: dict = {"truth": t}
        if ours is None:
            err = next((r.get("error", "") for r in by[(name, "ours")]), "")
            row["ours_error"] = err
            ours_txt, diff_txt = "CRASHED", "-"
            off_truth.append((name, "crashed", err))
        else:
            a = ours["answers"]
            row["ours"] = [a[k] for k in PARTS]
            row["ours_analyze"] = a["analyze"]
            row["ours_runs_agree"] = all(r.get("answers", {}).get("ns") == a["ns"] for r in by[(name, "ours")])
            ours_txt = _fmt3(row["ours"])
            n = a["analyze"]["numbers"]
            row["analyze_vs_breakdown"] = [n.get(f"gpu_{k}_pct") for k in PARTS]
            if t:
                worst = max(abs(x - y) for x, y in zip(row["ours"], t))
                row["ours_minus_truth_max"] = worst
                diff_txt = f"{worst:.2f}" + (" !!" if worst > 1 else "")
                if worst > 1:
                    off_truth.append((name, "temporal_breakdown", row["ours"], t))
                if any(v is None or abs(v - x) > 1 for v, x in zip(row["analyze_vs_breakdown"], t)):
                    off_truth.append((name, "analyze() numbers", row["analyze_vs_breakdown"], t))
            else:
                diff_txt = "-"
        if hta is None:
            err = next((r.get("error", "") for r in by[(name, "hta")]), "")
            row["hta_error"] = err
            hta_txt, idle_txt = "process failed: " + (err.splitlines() or [""])[-1], "-"
        else:
            h = hta["answers"]
            if "idle" in h:
                row["hta"] = [h[k] for k in PARTS]
                hta_txt = _fmt3(row["hta"])
            else:
                row["hta_error"] = h["temporal_error"]
                hta_txt = "crashed: " + h["temporal_error"]
            if "idle_breakdown_us" in h:
                total = sum(h["idle_breakdown_us"].values()) or 1
                row["hta_idle_breakdown_us"] = h["idle_breakdown_us"]
                idle_txt = "yes: " + ", ".join(f"{k} {v / total:.0%}" for k, v in h["idle_breakdown_us"].items() if v)
            else:
                row["hta_idle_breakdown_error"] = h["idle_breakdown_error"]
                idle_txt = "crashed: " + h["idle_breakdown_error"]
        print(f"{name:40s} {_fmt3(t):18s} {ours_txt:18s} {diff_txt:>14s}  {hta_txt:18s} {idle_txt}")
        result["traces"][name] = row
    result["ours_off_truth"] = off_truth
    print("our figures more than 1 point from the truth: " + ("none" if not off_truth else repr(off_truth)))

    print("\nSpeed and memory (fresh process per run: interpreter start + imports + work; median (min..max) "
          "over the runs; ratio HTA/ours of the medians [min..max interval])")
    print(f"{'trace':40s} {'ours wall s':>20s} {'HTA wall s':>20s} {'HTA/ours wall':>20s} "
          f"{'ours PSS GB':>12s} {'HTA PSS GB':>11s} {'HTA/ours mem':>20s}  in-process s ours | HTA")
    for name, _ in targets:
        o, h = by[(name, "ours")], by[(name, "hta")]
        ow, hw = [r["wall_s"] for r in o], [r["wall_s"] for r in h]
        om, hm = [r["peak_gb"] for r in o], [r["peak_gb"] for r in h]
        wr, mr = _interval(hw, ow), _interval(hm, om)
        crashed = any("temporal_error" in r.get("answers", {}) or "error" in r for r in h)
        stage = lambda rs, skip: med([sum(v for k, v in r["answers"]["stage_s"].items() if k not in skip)  # noqa: E731
                                      for r in rs if "answers" in r] or [float("nan")])
        ow_in, hw_in = stage(o, ("import",)), stage(h, ("import",))
        oq = [r["wall_s"] for r in o if r["others_cores"] <= QUIET]
        hq = [r["wall_s"] for r in h if r["others_cores"] <= QUIET]
        quiet = _interval(hq, oq) if oq and hq else None
        print(f"{name:40s} {med(ow):6.2f} ({min(ow):.2f}..{max(ow):.2f}) {med(hw):6.2f} ({min(hw):.2f}..{max(hw):.2f})"
              f" {wr[0]:6.2f}x [{wr[1]:.2f}..{wr[2]:.2f}] {med(om):12.3f} {med(hm):11.3f} "
              f"{mr[0]:6.2f}x [{mr[1]:.2f}..{mr[2]:.2f}]  {ow_in:.3f} | {hw_in:.3f}"
              + (f"  quiet runs only ({len(oq)}|{len(hq)}): {quiet[0]:.2f}x [{quiet[1]:.2f}..{quiet[2]:.2f}]" if quiet
                 else "  no quiet run of both")
              + ("  (HTA crashed: its time is time to crash)" if crashed else ""))
        stages = {tool: {k: med([r["answers"]["stage_s"][k] for r in rs if "answers" in r])
                         for k in (next((r for r in rs if "answers" in r), {"answers": {"stage_s": {}}})
                                   ["answers"]["stage_s"])}
                  for tool, rs in (("ours", o), ("hta", h))}
        result["traces"][name].update({
            "ours_wall_s": ow, "hta_wall_s": hw, "ours_peak_gb": om, "hta_peak_gb": hm,
            "wall_ratio_hta_over_ours": wr, "mem_ratio_hta_over_ours": mr, "wall_ratio_quiet_runs": quiet,
            "hta_crashed": crashed,
            "stage_s_median": stages})

    # The K-times trace against the original: compute and non-compute exactly K times, idle as predicted.
    base, longer = targets[[n for n, _ in targets].index(Path(made["source"]).name)][0], targets[-1][0]
    b = next((r["answers"] for r in by[(base, "ours")] if "answers" in r), None)
    k = next((r["answers"] for r in by[(longer, "ours")] if "answers" in r), None)
    check: dict = {}
    if b and k:
        shift_ns = round(made["shift_us"] * 1000)
        window = (times - 1) * shift_ns + b["ns"]["window"]
        expect = {"window": window, "compute": times * b["ns"]["compute"],
                  "non_compute": times * b["ns"]["non_compute"]}
        expect["idle"] = window - expect["compute"] - expect["non_compute"]
        off_ns = {p: k["ns"][p] - expect[p] for p in expect}
        naive = [k[p] - b[p] for p in PARTS]
        predicted = [100 * expect[p] / window for p in PARTS]
        check = {"expected_ns": expect, "measured_ns": k["ns"], "off_ns": off_ns, "naive_pct_diff": naive,
                 "predicted_pct": predicted, "measured_pct": [k[p] for p in PARTS]}
        check["ok"] = all(abs(v) <= 1000 * times for v in off_ns.values())  # within 1 µs per copy (float ts)
        print(f"\nx{times} check (ours): compute {k['ns']['compute']} ns = {times} x {b['ns']['compute']} "
              f"(off {off_ns['compute']} ns), non-compute off {off_ns['non_compute']} ns, window off "
              f"{off_ns['window']} ns -> {'OK' if check['ok'] else 'MISMATCH'}")
        print(f"  shares x{times}: {_fmt3([k[p] for p in PARTS])}, predicted from x1 and the shift "
              f"{_fmt3(predicted)}; x1 {_fmt3([b[p] for p in PARTS])}: the idle share moves by "
              f"{naive[0]:+.2f} points because each copy adds the {made['span_us'] / 1e3:.1f} ms span around its "
              f"{b['ns']['window'] / 1e6:.1f} ms GPU window (+gap) as idle between copies"
              + ("" if abs(naive[0]) <= 0.5 else "; so x1 and x10 shares differ by more than 0.5 point by "
                 "construction, "
                 "and the check is the exact one above"))
    result["concat_check"] = check

    print("\nDisturbance: cores used by other processes during each run (2 cores on this machine)")
    others = [r["others_cores"] for r in runs]
    busy = [r for r in runs if r["others_cores"] > QUIET]
    print(f"  median {med(others):.2f}, max {max(others):.2f}; runs with others > {QUIET} cores: {len(busy)} of "
          f"{len(runs)}" + (": " + ", ".join(f"{r['trace']}/{r['tool']} {r['others_cores']:.2f}" for r in busy)
                            if busy else ""))
    result["disturbed_runs"] = [(r["trace"], r["tool"], r["others_cores"]) for r in busy]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", nargs="?", const="tests/data/h200", default=None, metavar="DIR",
                        help="real-trace mode on the traces in DIR (default tests/data/h200)")
    parser.add_argument("--runs", type=int, default=3, help="real mode: runs per tool per trace")
    parser.add_argument("--times", type=int, default=10,
                        help="real mode: the largest trace made this many times longer")
    parser.add_argument("--gap-us", type=float, default=10.0, help="real mode: gap between the copies")
    parser.add_argument("--wait-quiet", type=float, default=20.0, metavar="S",
                        help="real mode: before each run, wait up to S s for other processes to use < 0.25 core")
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--dir", default="/tmp/infragent-hta-bench")
    parser.add_argument("--hta-runs", type=int, default=2)
    parser.add_argument("--our-runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    real(args) if args.real else synthetic(args)


if __name__ == "__main__":
    main()
