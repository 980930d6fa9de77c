"""How fast the ledger takes probe records: SQLite against PostgreSQL (a local server this script starts, Unix
socket, fsync on as a real server runs), with 1, 2 and 4 writer processes appending to one run at once.

Each record is one probe result with a feedback of about 2 KB (the size of a bench probe's Feedback), in its
own transaction, as the loop writes them. Rounds interleave the backends; prints records per second (all
writers together), median of the rounds with a 95% bootstrap CI. This grounds the scale-out arithmetic: a
trial writes tens of records, so even 64 nodes finishing a trial a minute each ask for well under 100
records/s.

    PYTHONPATH=src .venv/bin/python benchmarks/ledger_append_rate.py [--rounds 5] [--records 300] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from infragent.analysis.stats import bootstrap_median
from infragent.lab.ledger import Ledger

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from pg_server import fresh_database, postgres_server, unavailable  # noqa: E402

SRC = Path(__file__).parents[1] / "src"
WRITER = """
import sys, time
from infragent.lab.ledger import Ledger
book = Ledger(sys.argv[1])
run, who, n = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
feedback = {"probe": "bench", "verdict": "pass", "finding": "x" * 200,
            "numbers": {f"n{i}": {"value": i * 1.5, "unit": "ms"} for i in range(40)}}
print(time.time(), flush=True)
for i in range(n):
    book.record_probe(run, f"{who}/{i}", feedback)
print(time.time(), flush=True)
"""


def append_rate(location: str, writers: int, records: int, script: Path) -> float:
    """Records per second, all writers together, from the first start to the last finish."""
    run = Ledger(location).start_run("optimize", None, None, None)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [subprocess.Popen([sys.executable, str(script), location, str(run), f"w{w}", str(records)], env=env,
                              stdout=subprocess.PIPE, text=True) for w in range(writers)]
    stamps = [[float(x) for x in p.communicate(timeout=600)[0].split()] for p in procs]
    return writers * records / (max(s[1] for s in stamps) - min(s[0] for s in stamps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"ledger_append_rate: {why}")
    work = Path(tempfile.mkdtemp(prefix="ledger-rate-"))
    script = work / "writer.py"
    script.write_text(WRITER)
    rates: dict[str, list[float]] = {}
    with postgres_server(fsync=True) as server:
        for r in range(args.rounds):
            for writers in (1, 2, 4):
                backends = ["sqlite", "postgresql"] if r % 2 == 0 else ["postgresql", "sqlite"]
                for backend in backends:
                    location = (str(work / f"{uuid.uuid4().hex}.sqlite") if backend == "sqlite"
                                else fresh_database(server, f"rate_{uuid.uuid4().hex[:10]}"))
                    rates.setdefault(f"{backend}/{writers}", []).append(
                        append_rate(location, writers, args.records, script))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {args.records} records per writer, {args.rounds} rounds")
    for key, samples in rates.items():
        s = bootstrap_median(samples)
        print(f"  {key:>14} writers: {s.center:7.0f} records/s [{s.lo:.0f}, {s.hi:.0f}]")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "records": args.records, "rates": rates,
                                         "when": time.time()}, indent=1))


if __name__ == "__main__":
    main()
