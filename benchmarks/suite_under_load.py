"""The test suite on a busy machine: `python -m pytest` with every core saturated by other processes, or quiet.

    .venv/bin/python benchmarks/suite_under_load.py [--hogs 2] [--quiet] [--timeout-min 120] [--json out.json]
                                                    [--log pytest.log] [pytest args]

The hogs are separate processes spinning in pure Python (one per core by default), started before the suite
and killed when it ends or at the timeout, whichever comes first, so the load is bounded in time. Reported:
the suite's wall time, its pass/fail counts, the peak RSS of the pytest process (tests/conftest.py prints
it), and how much CPU the hogs got (proof that they really competed). The must-show of issue 23: the suite
passes with both cores saturated; the peak RSS stays under 4 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True:\n    pass\n"


def start_hogs(count: int) -> list[subprocess.Popen]:
    """count processes that each keep one core busy."""
    return [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_suite(timeout_s: float, extra: list[str], log: Path | None = None) -> dict:
    """The suite once: wall time, exit status, counts and the peak RSS it printed (the whole output to log)."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE", *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        rc = None
    wall = time.monotonic() - started
    if log is not None:
        log.write_text(out)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)\b", out)}
    peak = re.search(r"peak RSS of the pytest process: ([\d.]+) GB", out)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    return {"wall_s": wall, "rc": rc, "counts": counts, "peak_rss_gb": float(peak.group(1)) if peak else None,
            "failed": failed, "tail": out[-4000:]}


def main() -> None:
    """Run the suite under the hogs (or quiet) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    parser.add_argument("--quiet", action="store_true", help="no hogs: the quiet baseline")
    parser.add_argument("--timeout-min", type=float, default=120.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--log", type=Path, default=None, help="write pytest's whole output here")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (e.g. a test file)")
    args = parser.parse_args()
    hogs = [] if args.quiet else start_hogs(args.hogs)
    try:
        result = run_suite(args.timeout_min * 60, args.pytest_args, args.log)
        hog_cpu = [cpu_seconds(h.pid) for h in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    result.update(hogs=len(hogs), hog_cores=sum(hog_cpu) / result["wall_s"] if hogs else 0.0,
                  cpu=os.cpu_count())
    verdict = "PASS" if result["rc"] == 0 else "FAIL"
    print(f"{'quiet' if args.quiet else f'{len(hogs)} hogs'}: {verdict} in {result['wall_s'] / 60:.1f} min, "
          f"{result['counts']}, peak RSS {result['peak_rss_gb']} GB (limit 4), hogs used "
          f"{result['hog_cores']:.2f} of {result['cpu']} cores")
    for name in result["failed"]:
        print(f"  failed: {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
