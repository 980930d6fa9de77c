"""The paged decode-attention kernel of the working tree against its version at another git revision.

Both versions are compiled side by side (each under its own op namespace) and called on the same random
paged cache and block table, alternating which runs first each round; prints µs per call for both, the
ratio (working tree / revision) with a bootstrap 95% CI per batch size, and the largest output difference.
    PYTHONPATH=src .venv/bin/python benchmarks/paged_attention_ab.py --against HEAD~1 [--batch 1 4 32]
        [--context 160] [--rounds 40]
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from infragent.analysis.stats import bootstrap_median, paired_ratio
from infragent.engine.kernels.build import CFLAGS, HERE

FILES = ("paged_attention.cpp", "vec.h")


def build(tag: str, texts: dict[str, str], root: Path) -> object:
    """Compile one version of the kernel as torch.ops.<tag>.paged_decode_attention."""
    directory = root / tag
    directory.mkdir()
    for name, text in texts.items():
        (directory / name).write_text(text.replace("TORCH_LIBRARY(infragent,", f"TORCH_LIBRARY({tag},")
                                      .replace("TORCH_LIBRARY_IMPL(infragent,", f"TORCH_LIBRARY_IMPL({tag},"))
    load(name=f"attention_{tag}", sources=[str(directory / FILES[0])], extra_cflags=CFLAGS,
         is_python_module=False, build_directory=str(directory))
    return getattr(torch.ops, tag).paged_decode_attention.default


def time_call(op: object, args: tuple, calls: int = 100) -> float:
    """Mean µs per call over `calls` back-to-back calls."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        op(*args)
    return (time.perf_counter_ns() - start) / calls / 1e3


def main() -> None:
    """Build both versions, then A/B them per batch size."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", default="HEAD", help="git revision of the baseline kernel")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--context", type=int, default=160, help="longest context; rows draw from [100, it]")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(2)
    top = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
    source = HERE.relative_to(top)
    old = {name: subprocess.check_output(["git", "show", f"{args.against}:{source / name}"], text=True)
           for name in FILES}
    new = {name: (HERE / name).read_text() for name in FILES}
    with tempfile.TemporaryDirectory() as root:
        ops = {"baseline": build("ab_baseline", old, Path(root)), "tree": build("ab_tree", new, Path(root))}
    gen = torch.Generator().manual_seed(0)
    for batch in args.batch:
        kv_heads, dim, block_size = 3, 64, 16
        blocks = -(-args.context // block_size)
        k, v = (torch.randn(batch * blocks, kv_heads, block_size, dim, generator=gen) for _ in range(2))
        table = torch.randperm(batch * blocks, generator=gen).view(batch, blocks).contiguous()
        lens = torch.randint(100, args.context + 1, (batch,), generator=gen)
        call = (torch.randn(batch, 3 * kv_heads, dim, generator=gen), k, v, table, lens)
        diff = (ops["tree"](*call) - ops["baseline"](*call)).abs().max().item()
        samples: dict[str, list[float]] = {"baseline": [], "tree": []}
        for r in range(args.rounds):
            for name in (("baseline", "tree") if r % 2 == 0 else ("tree", "baseline")):
                samples[name].append(time_call(ops[name], call))
        print(f"batch {batch:3d}: tree {bootstrap_median(samples['tree']).fmt(1)} µs, {args.against} "
              f"{bootstrap_median(samples['baseline']).fmt(1)} µs, tree/{args.against} "
              f"{paired_ratio(samples['baseline'], samples['tree']).fmt(3)}, max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
