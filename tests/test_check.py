"""The check probe: planted bugs are localized to their shard, guards name cheats, partitioned runs agree."""
from __future__ import annotations

import json

import pytest
import torch

import check_cases as cc
from infragent.probes.check import MATMUL_SHAPES, PartitionError, diff_outputs, run_check
from infragent.probes.partition import combine, parse_partition, split_case


def test_correct_candidate_passes_over_odd_shapes():
    fb = run_check(cc.blocked_matmul, cc.matmul, cc.matmul_inputs, trials=len(MATMUL_SHAPES))
    assert fb.verdict == "pass", fb.render()
    labels = [row["label"] for row in fb.details["trials"]]
    assert labels == [f"{m}x{k}x{n}" for m, k, n in MATMUL_SHAPES]  # every shape, odd sizes included
    assert set(fb.details["error_by_reduction"]) == {k for _, k, _ in MATMUL_SHAPES}
    assert 0 < fb.numbers["max_rel_err"].value < 1e-4 and fb.numbers["trials"].value == len(MATMUL_SHAPES)
    assert fb.numbers["max_ulp"].value >= 1 and fb.details["guards"] == []
    json.loads(fb.to_json())


def test_each_trial_draws_fresh_inputs():
    seen = []

    def factory(trial, generator):
        case = cc.matmul_inputs(0, generator)  # same shape every trial: values must still differ
        seen.append(case.args[0].clone())
        return case
    run_check(cc.matmul, cc.matmul, factory, trials=3, guards=False)
    assert len(seen) == 3 and not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


@pytest.mark.parametrize("candidate", [cc.tp_matmul_buggy, cc.tp_matmul_scaled])
def test_tp_shard_bug_is_localized_to_shard_2_and_its_columns(candidate):
    fb = run_check(candidate, cc.matmul, cc.tp_inputs, partition="column:4", trials=4)
    assert fb.verdict == "fail"
    assert fb.locality["shard"] == 2 and fb.locality["range"] == [512, 768]
    assert fb.locality["slice"] == "output[:, 512:768]" and "shards" not in fb.locality
    assert 512 <= fb.locality["first_bad_index"][1] < 768
    assert fb.finding.startswith("shard 2 of column:4 differs: output[:, 512:768], first bad index (0, 512)")
    assert all(row["bad_shards"] == [2] for row in fb.details["trials"])


def test_correct_tp_matmul_passes_column_partition():
    assert run_check(cc.tp_matmul, cc.matmul, cc.tp_inputs, partition="column:4", trials=4).verdict == "pass"


def test_mismatch_without_partition_suggests_one():
    fb = run_check(cc.tp_matmul_buggy, cc.matmul, cc.tp_inputs, trials=2)
    assert fb.verdict == "fail" and "differs on 2/2 trials" in fb.finding
    assert any("--partition" in p for p in fb.next_probes)


def test_rows_wrong_only_in_the_second_half_are_localized_by_batch_2():
    fb = run_check(cc.second_tile_buggy, cc.matmul, cc.batch_inputs, partition="batch:2", trials=4)
    assert fb.verdict == "fail" and fb.finding.startswith("shard 1 of batch:2 differs: output[8:16, :]")
    assert fb.locality["shard"] == 1 and fb.locality["range"] == [8, 16]
    assert fb.locality["first_bad_index"] == (8, 0)


def test_one_bad_head_is_localized_by_heads_partition():
    fb = run_check(cc.attention_head5_buggy, cc.attention, cc.attention_inputs, partition="heads:4", trials=3)
    assert fb.verdict == "fail" and fb.locality["shard"] == 2 and fb.locality["range"] == [4, 6]
    assert fb.locality["first_bad_index"][1] == 5
    assert run_check(cc.attention, cc.attention, cc.attention_inputs, partition="heads:4", trials=3).verdict == "pass"


@pytest.mark.parametrize("partition", ["row:4", "splitk:4", "batch:2", "column:4"])
def test_partitioned_correct_matmul_passes(partition):
    fb = run_check(cc.blocked_matmul, cc.matmul, cc.matmul_inputs, partition=partition, trials=len(MATMUL_SHAPES))
    assert fb.verdict == "pass", fb.render()
    assert f"{partition} partitioned run agrees" in fb.finding
    rows = fb.details["trials"]
    assert all(row["partitioned"]["bad_shards"] == [] and row["partitioned"]["combined"]["bad"] == 0 for row in rows)
    assert max(len(row["partitioned"]["shards"]) for row in rows) == int(partition.split(":")[1])


def test_splitk_partition_catches_a_bug_only_on_short_reductions():
    fb = run_check(cc.short_k_buggy, cc.matmul, cc.long_k_inputs, partition="splitk:4", trials=3)
    assert fb.verdict == "fail"
    assert fb.finding.startswith("partitioned run splitk:4 differs on shards 0 (arg 0[:, 0:256], arg 1[0:256, :]), 1 (")
    assert "while the unpartitioned run agrees" in fb.finding
    assert fb.locality["shard"] == 0
    assert run_check(cc.short_k_buggy, cc.matmul, cc.long_k_inputs, trials=3).verdict == "pass"


@pytest.mark.parametrize("make, guard, words", [
    (lambda: cc.mutating_matmul, "input_mutation", "candidate mutates its input arg 0 (x)"),
    (cc.make_caching_matmul, "output_caching", "a second call with new inputs returned the first call's result"),
    (cc.make_id_caching_matmul, "output_caching", "by tensor identity"),
    (lambda: cc.constant_matmul, "constant_output", "does not depend on its inputs"),
    (lambda: cc.nan_matmul, "nonfinite_output", "NaN/Inf where the reference is finite"),
])
def test_guards_fail_and_name_the_cheat(make, guard, words):
    fb = run_check(make(), cc.matmul, cc.matmul_inputs, trials=3)
    assert fb.verdict == "fail"
    assert fb.locality["guard"] == guard and words in fb.finding
    assert guard in [g["guard"] for g in fb.details["guards"]]


def test_aliasing_output_is_flagged_and_a_real_copy_passes():
    fb = run_check(cc.lazy_copy, cc.copy_of, cc.vector_inputs, trials=3)
    assert fb.verdict == "fail" and fb.locality["guard"] == "output_alias"
    assert "aliases its input arg 0 (x)" in fb.finding
    assert run_check(cc.copy_of, cc.copy_of, cc.vector_inputs, trials=3).verdict == "pass"


def test_in_place_reference_excuses_in_place_candidate():
    fb = run_check(cc.relu_inplace, cc.relu_inplace, cc.vector_inputs, trials=3)
    assert fb.verdict == "pass", fb.render()


def test_bf16_tolerance_follows_dtype():
    fb = run_check(cc.blocked_matmul, cc.matmul, cc.bf16_inputs, trials=len(MATMUL_SHAPES))
    assert fb.verdict == "pass", fb.render()
    assert 1e-3 < fb.numbers["max_rel_err"].value < 1.6e-2  # bf16 rounding, not fp32-sized errors
    assert run_check(cc.blocked_matmul, cc.matmul, cc.bf16_inputs, trials=len(MATMUL_SHAPES), rtol=1e-5).verdict == "fail"


def test_compare_reports_nan_shape_and_first_bad_index():
    ref = torch.arange(12.0).reshape(3, 4)
    bad = ref.clone()
    bad[1, 2] += 1
    bad[2, 3] = float("nan")
    c = diff_outputs(bad, ref)
    assert not c.ok and c.first_bad_index == (1, 2) and c.bad == 2
    assert c.nonfinite == 1 and c.first_nonfinite == (2, 3)
    assert diff_outputs(torch.full((2,), float("nan")), torch.full((2,), float("nan"))).ok
    assert "shape (3, 3) != reference (3, 4)" in diff_outputs(ref[:, :3], ref).problem


@pytest.mark.parametrize("text, field", [
    ("column", "expected kind:count"),
    ("diag:4", "kind 'diag'"),
    ("column:four", "count 'four'"),
    ("column:0", "count '0'"),
    ("column:4:size=2", "unknown option 'size'"),
    ("column:4:dim=x", "option dim='x'"),
    ("row:4:out=0", "option out"),
    ("splitk:4:arg=0+1,dim=0+1+2", "option dim has 3 axes"),
])
def test_bad_partition_strings_name_the_field(text, field):
    with pytest.raises(PartitionError, match="partition") as err:
        parse_partition(text)
    assert field in str(err.value)


def test_partition_that_does_not_fit_the_inputs_is_an_error():
    with pytest.raises(PartitionError, match="arg 3 is not a tensor argument"):
        run_check(cc.matmul, cc.matmul, cc.matmul_inputs, partition="column:2:arg=3", trials=1)


def test_partition_defaults_and_options():
    col = parse_partition("column:4")
    assert (col.args, col.dims, col.out, col.sums) == ((1,), (-1,), -1, False)
    assert parse_partition("splitk:4").sums and parse_partition("row:2").dims == (-1, 0)
    heads = parse_partition("heads:4:dim=2")
    assert heads.args is None and heads.out == 2
    batch = parse_partition("batch:2:arg=q+k+v,dim=1,out=1")
    assert batch.args == ("q", "k", "v") and batch.dims == (1,) and batch.out == 1


@pytest.mark.parametrize("text", ["column:3", "splitk:3", "batch:4", "heads:3:arg=0+1,dim=0+0,out=0"])
def test_split_and_combine_reproduce_the_full_matmul(text):
    spec = parse_partition(text)
    x, w = torch.randn(10, 7, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    from infragent.probes.inputs import Case
    if spec.kind == "heads":  # split both operands on dim 0 as a batched op
        x, w = torch.randn(4, 3, 7, dtype=torch.float64), torch.randn(4, 7, 5, dtype=torch.float64)
    shards = split_case(spec, Case((x, w)))
    combined = combine(spec, [cc.matmul(*s.case.args) for s in shards])
    assert torch.allclose(combined, x @ w)


def test_cli_check_localizes_and_bad_partition_is_one_line(monkeypatch):
    from typer.testing import CliRunner

    from infragent.cli import app
    runner = CliRunner()
    base = ["check", "check_cases:tp_matmul_buggy", "--reference", "check_cases:matmul",
            "--inputs", "check_cases:tp_inputs", "--trials", "2"]
    result = runner.invoke(app, base + ["--partition", "column:4"])
    assert result.exit_code == 1
    assert "FAIL: shard 2 of column:4 differs: output[:, 512:768]" in result.output
    assert len(result.output.splitlines()) <= 12
    bad = runner.invoke(app, base + ["--partition", "column:four"])
    assert bad.exit_code == 2
    assert "error: partition 'column:four': count 'four' must be a positive integer" in bad.output
