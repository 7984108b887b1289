"""The gate's steps (runtime.gate) on numpy, with stand-in kernels: row subsets, the incremental
perturbation check (the rows it recomputes, what it catches), and what the CPU gate reports per shape."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cake_core.ir.text import parse_program
from cake_core.problems import list_problems, get_problem
from cake_core.problems.base import input_sampler, seed_words
from cake_core.runtime.cpu import check_on_cpu
from cake_core.runtime.gate import compare_to, perturbation_check, pick_rows
from cake_core.runtime.references import ReferenceCache, reference

PROBLEMS = {p.name: p for p in list_problems()}

SMALL = {"gemm_bf16": {"M": 40, "N": 24, "K": 16}, "tinygemm": {"M": 5, "N": 24, "K": 32},
         "kmeans_assign": {"B": 2, "N": 30, "K": 9, "D": 8}, "kmeans_update": {"B": 2, "N": 60, "K": 7, "D": 8},
         "knn_topk": {"Q": 20, "N": 50, "D": 8, "k": 4}}


def _as_kernel_output(p, want):
    """What a correct kernel writes: the oracle's outputs in the kernels' dtypes."""
    return {n: np.asarray(want[n]).astype(np.int32 if p.name in ("kmeans_assign", "knn_topk") or n == "counts"
                                          else np.float32).astype(np.float32) for n in p.outputs}


def _setup(name, seed=3):
    p = PROBLEMS[name]
    shape = SMALL[name]
    x = p.make_inputs(shape, input_sampler(seed, shape))
    ref = reference(p, x, shape, seed, device="cpu")
    return p, shape, x, ref


def _honest(p):
    return lambda inputs: _as_kernel_output(p, p.oracle(inputs))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_an_honest_kernel_passes_and_only_the_fed_rows_are_recomputed(name):
    p, shape, x, ref = _setup(name)
    got = _honest(p)(x)
    assert compare_to(p, got, ref)[0]
    calls = []
    counting = dataclasses.replace(p, oracle=lambda inputs: (_ for _ in ()).throw(AssertionError("full oracle")),
                                   rows=dataclasses.replace(p.rows, oracle=lambda i, r: calls.append(r.size) or
                                                            p.rows.oracle(i, r)))
    ok, err, msg, what = perturbation_check(counting, shape, x, got, ref, _honest(p), seed_words(3, shape), True)
    assert ok, msg
    assert calls and all(n == 1 for n in calls), calls      # one row (a point, a query, a cluster, a C row)
    assert what.startswith(f"{p.inputs[0]}[") and "1 row recomputed" in what


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_kernel_that_replays_its_first_output_fails_the_perturbation(name):
    p, shape, x, ref = _setup(name)
    first = _honest(p)(x)
    ok, _, msg, _ = perturbation_check(p, shape, x, first, ref, lambda inputs: first, seed_words(3, shape), True)
    assert not ok and ("rows it feeds" in msg or "did not change" in msg), msg


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_kernel_wrong_on_a_row_the_perturbation_does_not_feed_fails(name):
    p, shape, x, ref = _setup(name)
    got = _honest(p)(x)
    count = p.rows.count(shape)

    def stale_elsewhere(inputs):
        out = _honest(p)(inputs)
        fed = set(p.rows.rows_of_perturbed(inputs, np.flatnonzero(inputs[p.inputs[0]] != x[p.inputs[0]])).tolist())
        victim = next(r for r in range(count) if r not in fed)
        for n in out:   # poison one unfed row: the unperturbed reference still holds there
            p.row_view(n, out[n], shape)[victim] = np.nan
        return out

    ok, _, msg, _ = perturbation_check(p, shape, x, got, ref, stale_elsewhere, seed_words(3, shape), True)
    assert not ok and "rows it does not feed" in msg, msg


def test_row_subsets_are_distinct_sorted_and_seeded():
    p = get_problem("kmeans_assign")
    shape = {"B": 4, "N": 1000, "K": 8, "D": 8}
    a, b = pick_rows(p, shape, 50, seed=1), pick_rows(p, shape, 50, seed=1)
    np.testing.assert_array_equal(a, b)
    assert a.size == 50 and np.all(np.diff(a) > 0) and a.max() < 4000
    assert not np.array_equal(a, pick_rows(p, shape, 50, seed=2))
    assert pick_rows(p, {"B": 1, "N": 7, "K": 8, "D": 8}, 50, seed=1).size == 7


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_row_subset_check_catches_a_wrong_selected_row_and_passes_the_rest(name):
    p, shape, x, _ = _setup(name)
    rows = pick_rows(p, shape, 5, seed=4)
    ref = reference(p, x, shape, 3, device="cpu", rows=rows)
    got = _honest(p)(x)
    ok, _, msg = compare_to(p, got, ref)
    assert ok, msg
    bad = {n: v.copy() for n, v in got.items()}
    for n in bad:
        p.row_view(n, bad[n], shape)[rows[2]] = np.nan
    ok, _, msg = compare_to(p, bad, ref)
    assert not ok and "[on 5 rows]" in msg
    # and the perturbation check in row-subset mode
    ok, _, msg, what = perturbation_check(p, shape, x, got, ref, _honest(p), seed_words(3, shape), True)
    assert ok and "recomputed" in what, msg


def test_the_cpu_gate_says_which_check_each_shape_got_and_reuses_the_cached_reference(tmp_path):
    p = get_problem("gemm_bf16")
    prog = parse_program(p.seed_text())
    shapes = [{"M": 96, "N": 80, "K": 72}, {"M": 33, "N": 65, "K": 40}]
    refs = ReferenceCache(tmp_path / "refs")
    first = check_on_cpu(prog, p, shapes, seed=5, refs=refs)
    again = check_on_cpu(prog, p, list(reversed(shapes)), seed=5, refs=refs)     # order does not matter
    for c in first + again:
        assert c.correct and c.check == "full" and c.rows_checked == int(c.shape.split(",")[0][2:]), c
        assert c.perturbed.startswith("a[") and "1 row recomputed" in c.perturbed
    assert [c.reference for c in first] == ["computed", "computed"]
    assert [c.reference for c in again] == ["cached", "cached"] and refs.hits == 2
    assert [c.max_error for c in again] == [c.max_error for c in reversed(first)]
