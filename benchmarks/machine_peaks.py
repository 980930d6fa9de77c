"""Measured CPU roofline numbers: fp32 GEMV weight-streaming bandwidth, fp32 GEMM GFLOP/s, copy GB/s.

A thin command-line wrapper over infragent.probes.machine. It measures fresh by default (engine_throughput
records the peaks of every round); --cached reads or fills the per-machine cache that the roofline probe uses.
"""
from __future__ import annotations

import argparse
import json

from infragent.probes.machine import Peaks, format_peaks, machine_peaks, measure_peaks


def legacy_dict(peaks: Peaks) -> dict[str, float]:
    """The JSON keys this script has always printed (engine_throughput and throughput_report read them)."""
    return {"threads": peaks.threads, "gemv_fp32_bytes_per_s": peaks.gemv_fp32_bytes_per_s,
            "matmul_fp32_gflops": peaks.matmul_fp32_gflops, "copy_bytes_per_s": peaks.copy_bytes_per_s}


def main() -> None:
    """Measure and print (or dump as JSON) the machine peaks."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cached", action="store_true", help="use the per-machine cache (measure on a miss)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    peaks = (machine_peaks if args.cached else measure_peaks)(args.threads, quick=args.quick)
    print(json.dumps(legacy_dict(peaks)) if args.json else format_peaks(peaks))


if __name__ == "__main__":
    main()
