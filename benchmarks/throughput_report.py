"""Turn engine_throughput rounds into summaries (data) and render them as a text table (printing)."""
from __future__ import annotations

from dataclasses import asdict

from infragent.analysis.stats import Summary, bootstrap_median, ratio_summary

COLUMNS = ("c1", "c8", "c32", "prefill")


def collect(rounds: list[dict], engine: str, key: str) -> list[float]:
    """Raw per-round samples of one metric of one engine (rounds where it failed are left out)."""
    out = []
    for record in rounds:
        result = record["engines"].get(engine, {})
        if key == "rss":
            value = result.get("peak_rss_bytes")
        elif key == "rss_c1":  # the high-water mark through load, warm-up and c=1
            value = result.get("peak_rss_after", {}).get("c1")
        else:
            value = result.get("samples", {}).get(key)
        if value is not None and "error" not in result:
            out.append(float(value))
    return out


def variants(engines: list[str]) -> list[str]:
    """The infragent engines of the run (fp32, gguf, gguf-a16, gguf-a8, each held to AVX2 too, int8)."""
    return [e for e in engines if e.startswith("infragent")]


def summarize(rounds: list[dict], engines: list[str], config: dict) -> dict:
    """Medians, CIs, ratios, roofline and each target's verdict, as plain JSON-able data."""
    keys = COLUMNS + ("c1_decode_only", "rss", "rss_c1")
    table = {e: {k: asdict(bootstrap_median(collect(rounds, e, k))) for k in keys} for e in engines}
    peaks = {k: [r["peaks"][k] for r in rounds] for k in ("gemv_fp32_bytes_per_s", "matmul_fp32_gflops",
                                                          "copy_bytes_per_s")}
    summary: dict = {"table": table, "peaks": {k: asdict(bootstrap_median(v)) for k, v in peaks.items()},
                     "ratios": {}, "roofline": {}}
    for ours in variants(engines):
        for other in [e for e in ("transformers", "transformers-avx2", "llamacpp", "infragent")
                      if e in engines and e != ours]:
            summary["ratios"][f"{ours}/{other}"] = {
                k: asdict(ratio_summary(collect(rounds, ours, k), collect(rounds, other, k))) for k in COLUMNS}
        nbytes = next((r["engines"][ours].get("weight_nbytes") for r in rounds
                       if "weight_nbytes" in r["engines"].get(ours, {})), None)
        if nbytes:  # batch 1 streams every weight once per token: bandwidth / bytes is the ceiling
            roofline = [bw / nbytes for bw in peaks["gemv_fp32_bytes_per_s"]]
            decode = collect(rounds, ours, "c1_decode_only")
            summary["roofline"][ours] = {"weight_nbytes": nbytes, "tok_s": asdict(bootstrap_median(roofline)),
                                         "fraction": asdict(ratio_summary(decode, roofline))}
    summary["greedy_agreement_c1"] = agreement(rounds, engines)
    summary["memory"] = memory_floor(rounds, engines, config)
    summary["targets"] = targets(summary)
    return summary


def memory_floor(rounds: list[dict], engines: list[str], config: dict) -> dict[str, dict]:
    """Per infragent engine, what its whole-run peak cannot go below (medians over rounds, bytes): what Python and
    torch hold before the engine exists, plus the weights, plus the KV cache of c=32's requests at full length;
    next to the measured peak and what was resident at the end, by kind."""
    out = {}
    for engine in variants(engines):
        done = [r["engines"][engine] for r in rounds if "resident_torch" in r["engines"].get(engine, {})]
        if not done:
            continue
        tokens = config["concurrency"]["c32"] * (config["prompt_len"] + config["max_tokens"])
        torch_rss = sorted(d["resident_torch"]["VmRSS"] for d in done)[len(done) // 2]
        weights, per_token = done[0]["weight_nbytes"], done[0]["kv_nbytes_per_token"]
        out[engine] = {"torch": torch_rss, "weights": weights, "kv_c32": per_token * tokens,
                       "floor": torch_rss + weights + per_token * tokens, "kv_cache_dtype": done[0]["kv_cache_dtype"],
                       "peak": sorted(d["peak_rss_bytes"] for d in done)[len(done) // 2],
                       "resident_end": done[len(done) // 2].get("resident_end", {})}
    return out


def agreement(rounds: list[dict], engines: list[str]) -> dict[str, list[int]]:
    """Per round, how many leading c=1 greedy tokens each other engine shares with infragent (fp32)."""
    out: dict[str, list[int]] = {}
    for other in (e for e in engines if e != "infragent"):
        for record in rounds:
            a = record["engines"].get("infragent", {}).get("c1_token_ids")
            b = record["engines"].get(other, {}).get("c1_token_ids")
            if a and b:
                same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                out.setdefault(other, []).append(same)
    return out


def _verdict(summary_dict: dict | None, threshold: float, higher_is_better: bool = True) -> tuple[str, str]:
    """('PASS'|'FAIL'|'INCONCLUSIVE'|'n/a', rendered median [CI]) for one target: met only when the whole
    interval is on the right side of the threshold, missed only when the whole interval is on the wrong one."""
    if not summary_dict or summary_dict["n"] == 0:
        return "n/a", "n/a"
    s = Summary(_center(summary_dict), summary_dict["lo"], summary_dict["hi"], summary_dict["n"])
    good, bad = (s.lo >= threshold, s.hi < threshold) if higher_is_better else (s.hi <= threshold, s.lo > threshold)
    return ("PASS" if good else "FAIL" if bad else "INCONCLUSIVE"), s.fmt(2)


def targets(summary: dict) -> list[dict]:
    """The acceptance targets of the stored-weight engines (issue 25), each with its measured value and verdict:
    for gguf (the model's own numbers), gguf-a16 and gguf-a8 (activations as int8 digits), whichever the run
    has."""
    ratios, rows = summary["ratios"], []
    held = "transformers-avx2" in summary["table"]  # then the AVX2 rows compare like with like
    table = summary["table"]
    for fmt in [f for f in ("gguf", "gguf-a16", "gguf-a8")
                if f"infragent-{f}" in table or f"infragent-{f}-avx2" in table]:
        ours = f"infragent-{fmt}"
        rows += [(f"batch-1 decode {fmt} >= 1.3x llama.cpp", ratios.get(f"{ours}/llamacpp", {}).get("c1"), 1.3, True),
                 (f"c=32 {fmt} >= 2x transformers", ratios.get(f"{ours}/transformers", {}).get("c32"), 2.0, True),
                 (f"c=32 {fmt} (AVX2) >= 2x transformers{' (AVX2)' * held}",
                  ratios.get(f"{ours}-avx2/transformers{'-avx2' * held}", {}).get("c32"), 2.0, True),
                 (f"prefill {fmt} not slower than fp32", ratios.get(f"{ours}/infragent", {}).get("prefill"), 1.0, True),
                 (f"prefill {fmt} (AVX2) not slower than fp32",
                  ratios.get(f"{ours}-avx2/infragent", {}).get("prefill"), 1.0, True)]
        runs = [(ours, "rss_c1", "load, warm-up and c=1"), (ours, "rss", "the whole run, c=32's KV included")]
        runs += [(e, "rss", f"the whole run, KV in {e.partition('-kv-')[2]}") for e in table
                 if e.startswith(f"{ours}-kv-")]
        for engine, key, what in runs:
            rss = table.get(engine, {}).get(key)
            rows.append((f"{fmt} peak RSS ({what}) <= 0.6 GB", _in_gb(rss), 0.6, False))
    rows += default_path_rows(summary)
    out = []
    for name, value, threshold, higher in rows:
        verdict, shown = _verdict(value, threshold, higher)
        out.append({"target": name, "measured": shown, "verdict": verdict})
    return out


def default_path_rows(summary: dict) -> list[tuple]:
    """Issue 50's targets, for whichever of its engines the run has: the default path (weight_format auto, the
    model's own numbers) against transformers at c=1, c=32 and prefill, its whole-run peak RSS, and gguf-a16's
    c=32 and batch-1 share of the weight-stream roofline."""
    ratios, table, rows = summary["ratios"], summary["table"], []
    if "infragent-auto" in table:
        auto = ratios.get("infragent-auto/transformers", {})
        rows += [("c=32 auto >= 2.5x transformers", auto.get("c32"), 2.5, True),
                 ("prefill 512 auto >= 1.2x transformers", auto.get("prefill"), 1.2, True),
                 ("c=1 auto >= 4x transformers", auto.get("c1"), 4.0, True)]
        rss = table["infragent-auto"].get("rss")
        rows.append(("auto peak RSS (the whole run) <= 0.6 GB", _in_gb(rss), 0.6, False))
    if "infragent-gguf-a16" in table:
        rows += [("c=32 gguf-a16 >= 3.5x transformers",
                  ratios.get("infragent-gguf-a16/transformers", {}).get("c32"), 3.5, True),
                 ("batch-1 gguf-a16 >= 0.85 of the roofline",
                  summary["roofline"].get("infragent-gguf-a16", {}).get("fraction"), 0.85, True)]
    return rows


def _in_gb(rss: dict | None) -> dict | None:
    """A stored Summary of bytes in GB."""
    return {**rss, "center": _center(rss) / 1e9, "lo": rss["lo"] / 1e9, "hi": rss["hi"] / 1e9} if rss else None


def _cell(d: dict, scale: float = 1.0, digits: int = 1) -> str:
    """Render a Summary dict, optionally rescaled."""
    if d["n"] == 0:
        return "n/a"
    return Summary(_center(d) * scale, d["lo"] * scale, d["hi"] * scale, d["n"]).fmt(digits)


def _center(d: dict) -> float:
    """A stored Summary's center (files written before the field's rename call it "median")."""
    return d["center"] if "center" in d else d["median"]


def format_report(summary: dict, config: dict, env: dict) -> str:
    """The human-readable report: environment, throughput table, ratios, roofline, targets."""
    lines = [f"SmolLM2-135M (Q4_1 GGUF), {env['threads']} threads, {env['cpu_model']}, torch {env['torch']}, "
             f"git {env['git_commit'][:10]}{' (dirty)' if env['git_dirty'] else ''}",
             f"prompts {config['prompt_len']} tok, {config['max_tokens']} new tok (ignore_eos, greedy), "
             f"prefill {config['prefill_len']} tok; {config['repeats']} rounds; load avg "
             f"{env['loadavg_start'][0]:.1f} -> {env['loadavg_end'][0]:.1f}",
             "tok/s as median [95% bootstrap CI]; c=N: N requests at once, generated tokens / wall time", ""]
    header = f"{'engine':<24}" + "".join(f"{c:>22}" for c in ("c=1", "c=8", "c=32", "prefill")) + f"{'peak RSS MB':>22}"
    lines.append(header)
    for engine, row in summary["table"].items():
        cells = [_cell(row[k]) for k in COLUMNS] + [_cell(row["rss"], 1e-6, 0)]
        lines.append(f"{engine:<20}" + "".join(f"{c:>22}" for c in cells))
    for engine, note in config["skipped"].items():
        lines.append(f"{engine:<20}  {note}")
    for name, ratio in summary["ratios"].items():
        cells = [_cell(ratio[k], digits=2) for k in COLUMNS]
        lines.append(f"{name:<20}" + "".join(f"{c:>22}" for c in cells))
    if "llamacpp" in summary["table"]:
        lines.append("(llamacpp runs the GGUF's Q4_1 weights natively and does not batch: like its server, it "
                     "serves the c=8 and c=32 prompts one at a time; infragent runs fp32, gguf (the file's "
                     "blocks) or int8 weights, transformers fp32)")
    lines.append("")
    for engine, row in summary["table"].items():
        if row["c1_decode_only"]["n"]:
            lines.append(f"{engine} c=1 decode only (after first token): {_cell(row['c1_decode_only'])} tok/s")
    p = summary["peaks"]
    lines.append(f"machine: GEMV fp32 weight stream {_cell(p['gemv_fp32_bytes_per_s'], 1e-9, 2)} GB/s, "
                 f"matmul fp32 {_cell(p['matmul_fp32_gflops'])} GFLOP/s, copy {_cell(p['copy_bytes_per_s'], 1e-9, 2)} GB/s")
    for engine, roof in summary["roofline"].items():
        lines.append(f"{engine}: batch-1 roofline = GEMV bandwidth / {roof['weight_nbytes'] / 1e6:.1f} MB of weights "
                     f"per token = {_cell(roof['tok_s'])} tok/s; measured {_cell(roof['fraction'], 100, 0)} % of it")
    for engine, m in summary.get("memory", {}).items():
        mb = {k: m[k] / 1e6 for k in ("torch", "weights", "kv_c32", "floor", "peak")}
        lines.append(f"{engine} memory floor: Python + torch {mb['torch']:.0f} MB + weights {mb['weights']:.0f} MB + "
                     f"c=32's KV ({m['kv_cache_dtype']}) {mb['kv_c32']:.0f} MB = {mb['floor']:.0f} MB; peak {mb['peak']:.0f} MB")
    for other, same in summary["greedy_agreement_c1"].items():
        lines.append(f"greedy c=1 tokens identical to infragent before first divergence ({other}): "
                     f"{same} of {config['max_tokens']} per round")
    lines += ["", "targets (PASS: the whole 95% interval meets it; FAIL: the whole interval misses it):"]
    for t in summary["targets"]:
        lines.append(f"  {t['verdict']:<11} {t['target']:<42} measured {t['measured']}")
    return "\n".join(lines)
