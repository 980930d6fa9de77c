"""The report and the live dashboard, on real runs. A short `infragent optimize` (a small hybrid engine, one
knob with a real effect, the ladder's baseline trace) is followed live in the dashboard while it runs, then its
report is opened in headless Chromium; a `measure` run with one criterion that cannot pass shows a failing
headline. What the pages say is checked against the ledger, not against fixed words."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import pytest

from infragent.lab.ledger import Ledger
from infragent.report.data import run_report
from server_fixture import CONCURRENT, WIDE_HYBRID, tiny_target_toml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLAYWRIGHT = ROOT / ".venv" / "node_modules" / "playwright-core"
BROWSER = CHROMIUM is not None and shutil.which("node") is not None and PLAYWRIGHT.exists()
needs_browser = pytest.mark.skipif(not BROWSER, reason="needs Debian's chromium, node and playwright-core "
                                                       "(make test installs them where it can)")
SHOTS = Path(os.environ.get("INFRAGENT_SCREENSHOTS", ROOT / ".infragent" / "screenshots"))
KEY = "report-test-key"

OPTIMIZE_SPEC = tiny_target_toml(WIDE_HYBRID) + """
[knobs.max_num_seqs]
type = "int"
domain = [1, 8]
default = 1
touches = ["decode", "mlp", "attention", "kda"]
""" + CONCURRENT + """
[[criteria]]
scenario = "c8"
metric = "ttft_p99_ms"
max = 60000
"""

MEASURE_SPEC = tiny_target_toml() + """
[[scenarios]]
name = "short"
num_prompts = 16
max_concurrency = 4
random_input_len = 48
random_output_len = 8
repeats = 2

[[scenarios]]
name = "paced"
num_prompts = 16
request_rate = 40.0
random_input_len = 200
random_output_len = 8
repeats = 2

[[criteria]]
scenario = "short"
metric = "ttft_median_ms"
max = 60000

[[criteria]]
scenario = "paced"
metric = "output_tok_s"
min = 1000000
"""


def cli(*args: str, cwd: Path, **kw) -> subprocess.Popen:  # noqa: ANN003 (Popen's own options)
    """`python -m infragent.cli ARGS` from cwd, with this checkout's sources."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "INFRAGENT_ARTIFACTS": str(cwd / "artifacts-in")}
    return subprocess.Popen([sys.executable, "-m", "infragent.cli", *args], cwd=cwd, env=env, text=True, **kw)


def node(script: str, url: str, *rest: str, timeout: float) -> dict:
    """Run a Playwright script under tests/ on url (with Debian's chromium) and return the JSON it printed."""
    env = {**os.environ, "NODE_PATH": str(PLAYWRIGHT.parent)}
    out = subprocess.run(["node", str(Path(__file__).parent / script), url, CHROMIUM or "", *rest],
                         capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def start_ui(ledger: Path, cwd: Path, api_key: str | None = KEY) -> tuple[subprocess.Popen, str]:
    """`infragent ui` on a free port; (process, base URL) once it answers."""
    proc = cli("ui", "--ledger", str(ledger), "--port", "0", *(["--api-key", api_key] if api_key else []), cwd=cwd,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stderr.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
    assert found, line + proc.stderr.read()[-2000:] if proc.poll() is not None else line
    return proc, found.group(1)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> dict:
    """A real optimize run, followed live in the dashboard while it runs (when a browser is here)."""
    tmp = tmp_path_factory.mktemp("optimize")
    (tmp / "spec.toml").write_text(OPTIMIZE_SPEC)
    ledger = tmp / "ledger.sqlite"
    run = cli("optimize", str(tmp / "spec.toml"), "--ledger", str(ledger), "--budget-probes", "8",
              "--budget-minutes", "6", cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: dict = {"ledger": ledger, "tmp": tmp}
    ui = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None and not _has_run(ledger):
            time.sleep(0.2)
        ui, url = start_ui(ledger, tmp)
        seen["url"] = url
        seen["unauthorized"] = httpx.get(f"{url}/runs/1", timeout=30).status_code
        if BROWSER:
            SHOTS.mkdir(parents=True, exist_ok=True)
            seen["follow"] = node("follow_run.cjs", f"{url}/runs/1?key={KEY}", "400000", str(SHOTS / "dashboard.png"),
                                  timeout=460)
        seen["bearer"] = httpx.get(f"{url}/api/runs/1", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        seen["output"], _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(60)
        if ui is not None:
            ui.terminate()
            ui.wait(30)
    assert run.returncode == 0, seen.get("output", "")[-4000:]
    seen["report"] = ledger.parent / "report-run-1.html"
    return seen


def _has_run(ledger: Path) -> bool:
    if not ledger.exists():
        return False
    try:
        return bool(Ledger(ledger, readonly=True).runs())
    except Exception:  # noqa: BLE001 (the file may be half created)
        return False


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """`infragent measure` with one criterion that cannot pass, and its report with a trace given."""
    tmp = tmp_path_factory.mktemp("measure")
    (tmp / "spec.toml").write_text(MEASURE_SPEC)
    ledger = tmp / "ledger.sqlite"
    done = cli("measure", str(tmp / "spec.toml"), "--ledger", str(ledger), cwd=tmp, stdout=subprocess.PIPE,
               stderr=subprocess.STDOUT)
    out, _ = done.communicate(timeout=300)
    assert done.returncode == 0, out[-3000:]
    trace = tmp / "trace.json"
    subprocess.run([sys.executable, "-c", "from infragent.trace import Recorder, span\n"
                    "import threading, time\n"
                    "def work():\n    for _ in range(4):\n        with span('decode'): time.sleep(0.001)\n"
                    "with Recorder() as r:\n    t = threading.Thread(target=work, name='engine-loop'); t.start()\n"
                    "    with span('schedule'): time.sleep(0.002)\n    t.join()\n"
                    f"r.trace().save({str(trace)!r})"], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                   check=True, timeout=60)
    report = tmp / "report.html"
    made = cli("report", "1", "--ledger", str(ledger), "-o", str(report), "--trace", str(trace), cwd=tmp,
               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = made.communicate(timeout=120)
    assert made.returncode == 0, out
    return {"ledger": ledger, "report": report, "trace": trace}


def _judgements_in_ledger(ledger: Path) -> list[tuple[str, str, str, str]]:
    """(metric, phase, bucket, verdict) the ledger holds for what the headline shows: the best trial's, or the
    criterion probes' of a measure run."""
    book = Ledger(ledger, readonly=True)
    candidates = [c for c in book.candidates(1) if c["status"] == "measured" and c["feasible"]]
    if book.run(1)["kind"] == "optimize":
        best = max(candidates, key=lambda c: c["objective"])
        rows = best["judgements"]
    else:
        rows = [j for r in book.probe_results(1) if r["probe"] == "criterion"
                for j in r["feedback"]["details"]["judgements"]]
    return sorted((j["metric"], j["phase"], j["bucket"], j["verdict"]) for j in rows)


def test_the_report_is_self_contained(optimized, measured):
    for page in (optimized["report"].read_text(), measured["report"].read_text()):
        assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing loaded from a network
        assert "<script src" not in page and "<link" not in page


def test_the_optimize_report_agrees_with_the_ledger(optimized):
    data = run_report(Ledger(optimized["ledger"], readonly=True), 1)
    assert data.headline.best is not None, optimized["output"][-3000:]  # a real effect: max_num_seqs > 1 wins
    shown = sorted((j["metric"], j["phase"], j["bucket"], j["verdict"]) for j in data.headline.judgements)
    assert shown == _judgements_in_ledger(optimized["ledger"]) and all(v == "pass" for *_, v in shown)
    assert data.headline.stopped and data.trace is not None and data.trace.label == "ladder/trace"
    assert {p["side"] for p in data.points} == {"trial", "baseline"}
    assert all({"baseline", "best"} <= set(sides) for groups in data.cdfs.values() for sides in groups.values())


@needs_browser
def test_the_optimize_report_in_a_browser(optimized):
    seen = node("render_report.cjs", optimized["report"].as_uri(), str(SHOTS / "report-optimize.png"), timeout=180)
    assert not seen["errors"], seen["errors"]
    assert seen["title"] == "Run 1: optimize — completed" and seen["badge"] == "WIN"
    shown = sorted((c["metric"], c["phase"], c["bucket"], c["verdict"]) for c in seen["criteria"])
    assert shown == _judgements_in_ledger(optimized["ledger"])
    kinds = {c["kind"] for c in seen["charts"]}
    assert {"progress", "pareto", "cdf", "timeline"} <= kinds, kinds
    for c in seen["charts"]:
        if c["kind"] == "timeline":
            continue
        assert {"baseline", "best"} <= set(c["series"]), (c["title"], c["series"])
        assert all(s["marks"] > 0 for name, s in c["series"].items() if name in ("baseline", "best")), c
        assert c["xLabel"] and c["yLabel"] and c["ticks"] >= 4, c  # labelled axes with ticks, not min/max only
    assert len(seen["trialsBefore"]) >= 2
    assert all(key and key.startswith(f"trial/{n}/") for n, key in seen["trialRecords"]), seen["trialRecords"]
    ascending = [v for _, v in seen["sortedAscending"]]
    descending = [v for _, v in seen["sortedDescending"]]
    assert ascending == sorted(ascending) and descending == sorted(descending, reverse=True)
    assert seen["traceHref"] and seen["perfettoButton"] and seen["spans"] > 10
    trace_file = Path(unquote(urlparse(seen["traceHref"]).path))
    assert trace_file.is_file() and trace_file.parent.parent == optimized["ledger"].parent / "artifacts"
    assert seen["hypotheses"] >= 1 and seen["probes"] >= 5


@needs_browser
def test_the_perfetto_button_hands_over_the_saved_trace_and_uploads_nothing(measured):
    seen = node("open_in_perfetto.cjs", measured["report"].as_uri(), timeout=120)
    assert not seen["errors"] and seen["popupUrl"].startswith("https://ui.perfetto.dev"), seen
    assert seen["received"]["bytes"] == measured["trace"].stat().st_size and seen["received"]["head"].startswith("{")
    assert seen["received"]["fileName"] == measured["trace"].name + ".json"
    assert all(r["method"] == "GET" and r["bodyBytes"] == 0 for r in seen["requests"]), seen["requests"]
    assert {urlparse(r["url"]).scheme for r in seen["requests"]} <= {"file", "https"}


@needs_browser
def test_a_failing_criterion_shows_in_the_headline(measured):
    seen = node("render_report.cjs", measured["report"].as_uri(), str(SHOTS / "report-measure.png"), timeout=180)
    assert not seen["errors"], seen["errors"]
    assert seen["title"] == "Run 1: measure — completed"
    assert {c["metric"]: c["verdict"] for c in seen["criteria"]} == {"ttft_median_ms": "pass", "output_tok_s": "fail"}
    shown = sorted((c["metric"], c["phase"], c["bucket"], c["verdict"]) for c in seen["criteria"])
    assert shown == _judgements_in_ledger(measured["ledger"])
    cdfs = [c for c in seen["charts"] if c["kind"] == "cdf"]
    assert cdfs and all(c["series"].get("baseline", {}).get("marks", 0) > 1 for c in cdfs)
    assert Path(unquote(urlparse(seen["traceHref"]).path)) == measured["trace"] and seen["spans"] == 5


@needs_browser
def test_the_dashboard_shows_a_new_trial_without_a_reload(optimized):
    follow = optimized["follow"]
    assert not follow["errors"], follow["errors"]
    assert follow["opened"]["status"] == "running", follow
    appeared = follow["appeared"]
    assert "error" not in appeared and appeared["sameDocument"] and follow["navigations"] == 1, follow
    assert len(appeared["trials"]) > follow["opened"]["reportTrials"] and "left:" in appeared["budget"]


def test_the_dashboard_needs_its_key(optimized):
    assert optimized["unauthorized"] == 401
    answer = optimized["bearer"]
    assert answer.status_code == 200 and answer.json()["progress"]["budget"] == {"probes": 8, "minutes": 6.0}


def test_report_and_ui_say_what_is_wrong_in_one_line(measured, tmp_path):
    empty = tmp_path / "empty.sqlite"
    Ledger(empty)
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is not a database" * 100)
    cases = [(["report", "7", "--ledger", str(measured["ledger"])], "no run 7"),
             (["report", "1", "--ledger", str(tmp_path / "missing.sqlite")], "no ledger here"),
             (["report", "1", "--ledger", str(empty)], "has no runs yet"),
             (["report", "1", "--ledger", str(corrupt)], "not a usable ledger"),
             (["report", "1", "--ledger", str(measured["ledger"]), "--trace", str(tmp_path / "nope.json")], "nope.json"),
             (["ui", "--ledger", str(tmp_path / "missing.sqlite")], "no ledger here"),
             (["ui", "--ledger", str(empty)], "has no runs yet"),
             (["ui", "--ledger", str(corrupt)], "not a usable ledger"),
             (["ui", "--ledger", "postgresql://localhost:1/x"], "PostgreSQL ledger: not a usable ledger"),
             (["ui", "--ledger", "mysql://localhost/x"], "give a SQLite file path")]
    for args, words in cases:
        proc = cli(*args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], (args, out, err)
        assert "Traceback" not in err


def test_the_ui_answers_a_missing_run_with_a_page_not_a_traceback(measured, tmp_path):
    ui, url = start_ui(measured["ledger"], tmp_path, api_key=None)
    try:
        missing = httpx.get(f"{url}/runs/9", timeout=30)
        listing = httpx.get(f"{url}/", timeout=30)
        report = httpx.get(f"{url}/runs/1", timeout=30)
        artifact = httpx.get(f"{url}/artifacts/{'0' * 64}", timeout=30)
    finally:
        ui.terminate()
        ui.wait(30)
    assert missing.status_code == 404 and "no run 9" in missing.text and "Traceback" not in missing.text
    assert listing.status_code == 200 and 'href="/runs/1"' in listing.text
    assert report.status_code == 200 and "output_tok_s" in report.text
    assert artifact.status_code == 404
    hrefs = re.findall(r'href="(/artifacts/[0-9a-f]{64})"', report.text)
    assert hrefs, "served reports link evidence through /artifacts"
