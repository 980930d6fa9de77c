"""`loadgen --html`, `analyze --html` and `bench --html`: the CLI writes one offline page per probe, drawn from
the probe's raw evidence (records, trace, timed pairs) with the report's look."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from server_fixture import thread_server

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{cwd}", "INFRAGENT_ARTIFACTS": str(cwd / "arts")}
    return subprocess.run([sys.executable, "-m", "infragent.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def offline(page: str) -> str:
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script src" not in page
    return page


def series(page: str, kind: str) -> list[str]:
    """The data-series names drawn in the charts of one kind."""
    names = []
    for svg in re.findall(rf'<svg class="chart {kind}".*?</svg>', page, re.S):
        names += re.findall(r'data-series="([^"]+)"', svg)
    return names


def test_loadgen_html_draws_the_records(tmp_path):
    with thread_server() as url:
        done = cli("loadgen", "--base-url", url, "--num-prompts", "8", "--max-concurrency", "2", "--random-input-len",
                   "32", "--random-output-len", "6", "--repeats", "2", "--html", str(tmp_path / "lg.html"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    page = offline((tmp_path / "lg.html").read_text())
    assert "html: " in done.stderr
    assert page.count('class="chart cdf"') == 4  # TTFT, TPOT, ITL, E2EL (one bucket)
    assert all(name.startswith("measured (n=") for name in series(page, "cdf"))
    assert page.count('class="point ') == 2  # output tok/s of each repeat


def test_analyze_html_shows_where_the_time_goes(tmp_path):
    trace = tmp_path / "trace.json"
    subprocess.run([sys.executable, "-c", "from infragent.trace import Recorder, span\nimport time\n"
                    "with Recorder() as r:\n    for _ in range(3):\n        with span('step'):\n"
                    "            with span('mlp'): time.sleep(0.002)\n            with span('sample'): time.sleep(0.001)\n"
                    f"r.trace().save({str(trace)!r})"], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                   check=True, timeout=60)
    done = cli("analyze", str(trace), "--html", str(tmp_path / "an.html"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    page = offline((tmp_path / "an.html").read_text())
    assert page.count('class="span"') == 9 and "mlp" in page and 'class="trace-file"' in page
    assert 'id="trace-bytes"' in page  # small enough to open in Perfetto from the page itself


def test_bench_html_draws_every_pair(tmp_path):
    (tmp_path / "work.py").write_text("import time\n\ndef slow():\n    time.sleep(0.002)\n\n"
                                      "def fast():\n    time.sleep(0.001)\n")
    done = cli("bench", "work:fast", "--vs", "work:slow", "--budget-s", "1.5", "--html", str(tmp_path / "b.html"),
               cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    page = offline((tmp_path / "b.html").read_text())
    a, b = series(page, "pairs").count("A: work:slow"), series(page, "pairs").count("B: work:fast")
    assert a == b and a >= 3  # one point per timed pair on each side
    assert 'class="chart ratios"' in page


def test_html_to_an_unwritable_place_is_one_line(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}')
    done = cli("analyze", str(trace), "--html", str(tmp_path / "no" / "such" / "dir.html"), cwd=tmp_path)
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "--html" in lines[0] and "Traceback" not in done.stderr
