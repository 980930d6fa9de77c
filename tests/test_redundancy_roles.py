"""Redundancy that knows fused ops: work inside softmax, layer norm and SDPA is counted as its decomposition,
ops are paired by role (a scale divide never with a normalization divide), padding and per-chunk
recomputation are attributed separately, and a time gap beyond the FLOP ratio is explained."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import roofline_cases as rc
from infragent.probes.compact import compact
from infragent.probes.inputs import Case, draw
from infragent.probes.redundancy import describe, extra_work
from infragent.probes.time_gap import TimeGap
from infragent.probes.time_gap import describe as describe_gap
from infragent.probes.work import count_work
from test_roofline import FAST, cache_dir, fake_peaks  # noqa: F401 (the fixture isolates the peaks cache)

from infragent.probes.roofline import run_roofline

B, H, L, S, D = rc.ATT_B, rc.ATT_H, rc.ATT_L, rc.ATT_S, rc.ATT_D
SCORES = B * H * L * S


def test_a_fused_softmax_counts_as_its_parts_and_the_scale_is_not_the_normalization() -> None:
    work = count_work(rc.attention, draw(rc.attention_inputs, 0))
    assert not work.uncounted_ops
    assert work.by_role["matmul"] == (2, 2 * 2.0 * SCORES * D)
    assert work.by_role["scalar scale"] == (1, SCORES)  # scores / sqrt(d)
    for part in ("row max", "row-wise shift", "exp", "row sum", "row-wise scale"):  # inside torch.softmax
        assert work.by_role[part] == (1, SCORES), part
    assert work.role_ops["row-wise scale"] == ["_softmax"] and work.role_ops["scalar scale"] == ["div"]
    assert work.flops == 4.0 * SCORES * D + 6 * SCORES and work.syncs == 0


def test_layer_norm_and_sdpa_count_their_insides() -> None:
    x, w, b = torch.randn(8, 32), torch.randn(32), torch.randn(32)
    ln = count_work(F.layer_norm, Case(args=(x, (32,), w, b)))
    assert ln.flops == 7 * 256 + 2 * 8 and ln.by_role["feature-wise scale"] == (1, 256)
    q, k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 24, 8), torch.randn(1, 2, 24, 8)
    sdpa = count_work(F.scaled_dot_product_attention, Case(args=(q, k, v)))
    n = 1 * 2 * 16 * 24
    assert sdpa.by_role["matmul"][1] == 4.0 * n * 8 and sdpa.flops == 4.0 * n * 8 + 6 * n
    decomposed = count_work(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 8 ** -0.5, -1) @ v,
                            Case(args=(q, k, v)))
    assert decomposed.by_role == sdpa.by_role | {"matmul": (2, sdpa.by_role["matmul"][1])}


def test_padding_and_per_chunk_recomputation_are_attributed_apart() -> None:
    case = draw(rc.attention_inputs, 0)
    torch.testing.assert_close(rc.attention_padded_chunked(*case.args), rc.attention(*case.args))
    work, reference = count_work(rc.attention_padded_chunked, case), count_work(rc.attention, case)
    rows = {r.op: r for r in extra_work(work, reference)}
    assert rows["matmul"].kind == "inflated" and rows["matmul"].grown == "96 → 128"
    assert rows["matmul"].padding == pytest.approx(128 / 96) and rows["matmul"].recompute_flops == 0
    chunks = (S + -S % rc.KEY_TILE) // rc.KEY_CHUNK
    assert rows["row sum"].kind == "recomputed" and rows["row sum"].repeat / rows["row sum"].padding == pytest.approx(chunks)
    assert rows["exp"].kind == "recomputed" and round(rows["exp"].repeat / rows["exp"].padding) == chunks + 1
    inside_softmax = {"row max", "row-wise shift", "exp", "row sum", "row-wise scale"}
    assert not inside_softmax & {r.op for r in rows.values() if r.kind == "not in the reference"}
    assert work.syncs == chunks and reference.syncs == 0  # one .item() per chunk
    text = describe(list(rows.values()), work.flops)
    assert text.startswith("inflated by padding (dimension 96 → 128): matmul 1.33x")
    assert f"recomputed {chunks}x the reference's work" in text and "row sum" in text
    padding = sum(r.padding_flops for r in rows.values())
    recompute = sum(r.recompute_flops for r in rows.values())
    assert padding > 0 and recompute > 0
    assert padding + recompute <= work.flops - reference.flops + 1e-6


def test_the_roofline_names_the_padded_dimension_and_the_gap() -> None:
    fb = run_roofline(rc.attention_padded_chunked, rc.attention_inputs, reference=rc.attention, peaks=fake_peaks(),
                      **FAST)
    assert fb.locality["padded_dimension"] == "96 → 128"
    assert "inflated by padding (dimension 96 → 128)" in fb.finding
    gap = fb.details["time_gap"]
    assert gap["syncs"] == 4 and gap["reference_syncs"] == 0 and gap["ops"] > 5 * gap["reference_ops"]
    assert gap["chunks"] == 4 and gap["flop_ratio"] == pytest.approx(fb.numbers["flops"].value / (4.0 * SCORES * D + 6 * SCORES))
    if gap["wide"]:  # a timing: the explanation is given whenever the time ratio is far beyond the FLOP ratio
        assert "its FLOPs: the other" in fb.finding and "4 host syncs per call" in fb.finding
        assert any("host syncs" in p for p in fb.next_probes)
        reply = compact(fb)  # what an MCP client reads: the gap survives the clip, the dimension is in locality
        assert "4 host syncs per call" in reply["finding"] and reply["locality"]["padded_dimension"] == "96 → 128"


def test_a_gap_is_explained_by_syncs_ops_and_the_loop() -> None:
    gap = TimeGap(time_ratio=3.2, flop_ratio=1.28, gap_s=1.2e-3, syncs=16, reference_syncs=0, ops=214,
                  reference_ops=9, op_floor_s=2e-6, chunks=8.0)
    assert gap.wide and gap.op_overhead_s == pytest.approx(205 * 2e-6)
    text = describe_gap(gap)
    assert text.startswith("x3.20 the reference's time for x1.28 its FLOPs: the other 1.2 ms is not arithmetic")
    assert "16 host syncs per call" in text and "214 torch ops for its 9 (x23.8" in text and "at least 410 µs" in text
    assert "run 8x as often" in text
    near = TimeGap(1.3, 1.28, 1e-5, 0, 0, 9, 9, 2e-6, 1.0)
    assert not near.wide
