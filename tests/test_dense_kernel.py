"""The native dense fp32 product (small row counts) against float64 matmul on every instruction set this CPU
has; each output the same whatever the batch around it; and the per-shape, per-row-count choice between it
and BLAS, measured once per machine and kept."""
from __future__ import annotations

import json

import pytest
import torch

from infragent.engine import dense_choice
from infragent.engine.dense_choice import ROWS, ShapeChoice
from infragent.engine.models.layers import Linear
from test_weight_format import isas, needs_kernels

SHAPES = [(37, 64, 1), (5, 32, 3), (129, 576, 4), (130, 96, 17), (1, 32, 64), (64, 1536, 33), (19, 96, 65)]


@needs_kernels
def test_the_dense_kernel_equals_float64_matmul_on_every_isa(isa_restored) -> None:
    for isa in isas():
        torch.ops.infragent.qgemm_set_isa(isa)
        for i, (n, k, m) in enumerate(SHAPES):
            g = torch.Generator().manual_seed(i)
            w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
            reference = x.double() @ w.double().t()
            y = torch.ops.infragent.dense_linear(x, w)
            error = ((y.double() - reference).abs().max() / reference.abs().max()).item()
            assert y.shape == (m, n) and error < 1e-5, (isa, n, k, m, error)


@needs_kernels
def test_each_row_comes_out_the_same_alone_or_in_a_batch(isa_restored) -> None:
    g = torch.Generator().manual_seed(7)
    w, x = torch.randn(67, 256, generator=g), torch.randn(13, 256, generator=g)
    for isa in isas():
        torch.ops.infragent.qgemm_set_isa(isa)
        batch = torch.ops.infragent.dense_linear(x, w)
        for row in range(x.shape[0]):
            assert torch.equal(torch.ops.infragent.dense_linear(x[row:row + 1].contiguous(), w)[0], batch[row])


@needs_kernels
def test_bad_operands_are_refused_by_name() -> None:
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.infragent.dense_linear(torch.randn(2, 48), torch.randn(8, 48))
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.infragent.dense_linear(torch.randn(2, 64), torch.randn(8, 32))
    with pytest.raises(RuntimeError, match="fp32"):
        torch.ops.infragent.dense_linear(torch.randn(2, 64).double(), torch.randn(8, 64))


@needs_kernels
def test_a_linear_runs_the_kernel_only_at_its_chosen_row_counts_and_shares_a_tied_weight() -> None:
    embed = torch.randn(96, 64)
    head = Linear(embed)
    nbytes = head.weight_bytes()
    native = tuple(m in (1, 2) for m in range(ROWS[-1] + 1))
    head.use_dense_kernel(native, embed)
    assert head.weight_rows is embed and head.weight_bytes() == nbytes  # the kernel reads the embedding itself
    calls = []
    real = torch.ops.infragent.dense_linear

    class Spy:
        def dense_linear(self, x, w):  # noqa: ANN001, ANN201
            calls.append(x.shape[0])
            return real(x, w)

    ops, torch.ops.infragent = torch.ops.infragent, Spy()
    try:
        for m in (1, 2, 3, 70):
            x = torch.randn(m, 64)
            assert torch.allclose(head(x), x @ embed.t(), rtol=1e-5, atol=1e-5)
    finally:
        torch.ops.infragent = ops
    assert calls == [1, 2]
    whole = Linear(embed)
    whole.use_dense_kernel(tuple(m > 0 for m in range(ROWS[-1] + 1)), embed)
    assert whole.weight_t.t().data_ptr() == embed.data_ptr()  # the kernel at every row count: one layout, shared


@needs_kernels
def test_a_tied_head_keeps_blas_layout_for_the_rows_the_kernel_loses_and_reads_the_embedding_for_the_rest() -> None:
    embed = torch.randn(96, 64)
    head = Linear(embed)
    blas_layout = head.weight_t
    native = tuple(m >= 2 for m in range(ROWS[-1] + 1))  # one row: BLAS on W transposed is faster
    head.use_dense_kernel(native, embed)
    assert head.weight_t is blas_layout and head.weight_rows is embed  # no copy made: the embedding is held anyway
    for m in (1, 2, 5):
        x = torch.randn(m, 64)
        assert torch.allclose(head(x), x @ embed.t(), rtol=1e-5, atol=1e-5)
    untied = Linear(torch.randn(96, 64))
    untied.use_dense_kernel(native)
    assert untied.weight_rows is None and untied.weight_t.t().is_contiguous()  # one layout: the kernel's


def test_with_both_layouts_held_the_kernel_need_only_beat_blas_on_w_transposed() -> None:
    speedups = {rows: [2.0] for rows in ROWS}
    speedups[1] = [0.8]  # the LM head of an EPYC: one row slower, four rows far faster
    blas_rows = {rows: [1.0] for rows in ROWS}
    blas_rows[1] = [0.57]
    choice = ShapeChoice(49152, 512, 1, speedups, blas_rows)
    assert not any(choice.native_rows())  # one layout: the switch would cost one row 20%
    assert [m for m, on in enumerate(choice.native_rows(both_layouts=True)) if on] == list(range(2, 65))


def test_a_row_count_takes_the_choice_measured_at_the_next_size_up() -> None:
    speedups = {rows: [0.5, 0.5, 0.5] for rows in ROWS}
    speedups[4] = [1.3, 0.9, 1.2]  # median round faster
    speedups[64] = [2.0, 2.0, 0.1]
    blas_rows = {rows: [1.0, 1.0, 1.0] for rows in ROWS}  # BLAS as fast on either layout
    native = ShapeChoice(100, 64, 1, speedups, blas_rows).native_rows()
    assert len(native) == ROWS[-1] + 1 and not native[0]
    assert [m for m, on in enumerate(native) if on] == [3, 4, *range(33, 65)]


def test_the_kernel_must_beat_blas_in_either_layout_and_the_layout_switch_must_cost_no_row_count() -> None:
    speedups = {rows: [1.5] for rows in ROWS}
    blas_rows = {rows: [1.0] for rows in ROWS}
    blas_rows[2] = [1.6]  # BLAS on [out, in] is faster still at 2 rows: it runs there
    assert [m for m, on in enumerate(ShapeChoice(8, 64, 1, speedups, blas_rows).native_rows()) if on] == \
        [1, *range(3, 65)]
    speedups[1], blas_rows[1] = [0.6], [0.7]  # at one row both are slower than BLAS on W transposed
    assert not any(ShapeChoice(8, 64, 1, speedups, blas_rows).native_rows())


@needs_kernels
def test_the_choice_is_measured_once_per_machine_unless_the_cpu_was_contended(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFRAGENT_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(dense_choice, "ROUNDS", 1)
    monkeypatch.setattr(dense_choice, "_measured", {})
    waits = iter([0, 10**12])  # a thousand seconds in the run queue during the measurement
    monkeypatch.setattr(dense_choice, "run_queue_ns", lambda: next(waits))
    busy = dense_choice.choose(48, 64, 1)
    assert not busy.kept and not list(tmp_path.glob("kernels/**/*.json"))
    monkeypatch.setattr(dense_choice, "_measured", {})
    monkeypatch.setattr(dense_choice, "run_queue_ns", lambda: 0)
    quiet = dense_choice.choose(48, 64, 1)
    kept = list(tmp_path.glob("kernels/**/*.json"))
    assert quiet.kept and len(kept) == 1
    assert all(set(json.loads(kept[0].read_text())[k]) == {str(r) for r in ROWS} for k in ("speedups", "blas_rows"))
    monkeypatch.setattr(dense_choice, "_measured", {})
    monkeypatch.setattr(dense_choice, "measure", lambda *_: pytest.fail("measured again"))
    again = dense_choice.choose(48, 64, 1)
    assert (again.speedups, again.blas_rows) == (quiet.speedups, quiet.blas_rows)


@needs_kernels
def test_the_engine_uses_the_kernel_where_measured_and_never_under_kernels_torch() -> None:
    from infragent.engine.config import HybridConfig
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams
    from server_fixture import TINY_HYBRID

    hybrid = HybridConfig(**TINY_HYBRID)
    auto = LLM(model="hybrid", hybrid=hybrid, num_threads=1, max_model_len=256, kv_cache_gb=0.02)
    torch_ops = LLM(model="hybrid", hybrid=hybrid, num_threads=1, max_model_len=256, kv_cache_gb=0.02,
                    kernels="torch")
    try:
        expected = dense_choice.choose(*auto.engine.model.embed.shape, 1).native_rows(both_layouts=True)  # tied
        assert auto.engine.model.lm_head.native_rows == expected
        assert not torch_ops.engine.model.lm_head.native_rows
        prompts = ["The capital of France is", "1 2 3 4"]
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        for a, b in zip(auto.generate(prompts, greedy), torch_ops.generate(prompts, greedy)):
            assert a.token_ids == b.token_ids
    finally:
        auto.close()
        torch_ops.close()
