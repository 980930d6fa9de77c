"""The HTML report: built from a real measure run in the ledger, rendered in headless Chromium."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server_fixture import tiny_target_toml

SRC = Path(__file__).resolve().parent.parent / "src"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

SPEC = tiny_target_toml() + """\

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


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Run `infragent measure` on a tiny target, record a trace, and write the report."""
    tmp = tmp_path_factory.mktemp("report")
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(SRC), "INFRAGENT_ARTIFACTS": str(tmp / "artifacts-in")}
    ledger = str(tmp / "ledger.sqlite")
    cli = [sys.executable, "-m", "infragent.cli"]
    subprocess.run([*cli, "measure", str(spec), "--ledger", ledger], cwd=tmp, env=env, check=True,
                   capture_output=True, timeout=300)
    trace = tmp / "trace.json"
    subprocess.run([sys.executable, "-c", "from infragent.trace import Recorder, span\n"
                    "import threading, time\n"
                    "def work():\n    for _ in range(4):\n        with span('decode'): time.sleep(0.001)\n"
                    "with Recorder() as r:\n    t = threading.Thread(target=work, name='engine-loop'); t.start()\n"
                    "    with span('schedule'): time.sleep(0.002)\n    t.join()\n"
                    f"r.trace().save({str(trace)!r})"], env=env, check=True, timeout=60)
    out = tmp / "report.html"
    subprocess.run([*cli, "report", "1", "--ledger", ledger, "-o", str(out), "--trace", str(trace)], cwd=tmp,
                   env=env, check=True, capture_output=True, timeout=120)
    return out


def test_report_is_self_contained_and_complete(report):
    page = report.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no network: nothing external to load
    assert page.count('class="chart cdf"') == 3  # TTFT, TPOT, E2EL
    assert 'data-series="short"' in page and 'data-series="paced"' in page
    assert page.count('class="point"') == 4  # 2 scenarios x 2 repeats
    assert "short &lt;=128" in page and "paced &lt;=512" in page  # breakdown by bucket
    assert page.count('class="span"') == 5 and "engine-loop" in page  # timeline excerpt, two threads


PLAYWRIGHT = Path(__file__).resolve().parent.parent / ".venv" / "node_modules" / "playwright-core"


@pytest.mark.skipif(CHROMIUM is None or shutil.which("node") is None or not PLAYWRIGHT.exists(),
                    reason="needs Debian's chromium, node and playwright-core (make test installs them where it can)")
def test_report_renders_in_playwright(report):
    env = {**os.environ, "NODE_PATH": str(PLAYWRIGHT.parent)}
    out = subprocess.run(["node", str(Path(__file__).parent / "render_report.cjs"), str(report), CHROMIUM],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert seen["title"] == "Run 1: measure — completed"
    assert {c["metric"]: c["verdict"] for c in seen["criteria"]} == {"ttft_median_ms": "pass", "output_tok_s": "fail"}
    assert len(seen["cdfLines"]) == 6 and all(w > 10 for w in seen["cdfLines"])  # 3 CDFs x 2 scenarios, drawn
    assert seen["points"] == 4 and len(seen["bars"]) >= 4 and max(seen["bars"]) > 50 and seen["spans"] == 5


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it where it can)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    dom = subprocess.run([*args, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<h1>Run 1: measure — completed</h1>" in dom
    rows = re.findall(r'<tr class="verdict-(\w+)">(.*?)</tr>', dom, re.S)
    verdicts = {re.findall(r"<td>(.*?)</td>", row)[3]: verdict for verdict, row in rows}
    assert verdicts == {"ttft_median_ms": "pass", "output_tok_s": "fail"}  # the impossible minimum fails
    assert "in phase request, bucket all" in dom
    shot = tmp_path / "report.png"
    subprocess.run([*args, f"--screenshot={shot}", "--window-size=1000,1600", report.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000  # a page with charts, not a blank one
