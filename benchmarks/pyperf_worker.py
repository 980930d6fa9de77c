"""pyperf's own runner on one planted function: python pyperf_worker.py NAME -o out.json [pyperf options]."""
from __future__ import annotations

import sys
from pathlib import Path

import pyperf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import planted  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(2)
    runner = pyperf.Runner(add_cmdline_args=lambda cmd, args: cmd.append(args.function))  # workers need it too
    runner.argparser.add_argument("function", choices=["work", "work_again", "slow"])
    args = runner.parse_args()
    runner.bench_func("planted", getattr(planted, args.function))  # one name, so compare_to pairs the files
