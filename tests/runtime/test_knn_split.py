"""knn_topk_split and knn_topk_split_pp (the database split over a cluster, lists merged through distributed
shared memory): the GPU gate on the aligned shapes, ragged and empty splits, and the headline shape with its
median printed (marked `gpu`); their CPU checks are in tests/ir/test_topk_cluster.py and
tests/lower/test_lower_knn_split.py. The SPLIT variants run too: the CTAs of a cluster must be co-resident in
one GPC (32 clusters of 4 do not fit in one wave on the H200; 3 is the best-known knn_topk_split_pp3).
knn_topk_split_pp (two consumer roles taking turns, two m64n64 accumulators each) runs the same ragged shapes
(odd shares round up to a tile pair) and the headline, its median printed.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_knn_split.py -q -s -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SPLIT = corpus_file("knn_topk_split.cake").read_text()
PP = corpus_file("knn_topk_split_pp.cake").read_text()
KNN = get_problem("knn_topk")
ALIGNED = KNN.shape_set("knn_topk_aligned")
HEADLINE = {"Q": 4096, "N": 1048576, "D": 128, "k": 10}
# ragged last tiles, empty shares (300 rows: 3 tiles over 4 CTAs), several query tiles, a single query
EXTRA = [{"Q": 130, "N": 1000, "D": 128, "k": 10}, {"Q": 5, "N": 1300, "D": 8, "k": 3},
         {"Q": 1, "N": 300, "D": 32, "k": 16}, {"Q": 300, "N": 100_003, "D": 128, "k": 10}]
# knn_topk_split_pp's 64-row tiles: odd shares (700 rows: 3 + 3 + 3 + 2 tiles), a pair past the tensor
PP_EXTRA = [{"Q": 130, "N": 700, "D": 128, "k": 10}, {"Q": 257, "N": 1300, "D": 64, "k": 16}]


def _build(split: int, tmp, seed: str = SPLIT):
    text = seed.replace('"SPLIT": 4}', f'"SPLIT": {split}}}')
    lk = lower(parse_program(text, "knn_topk_split.cake"), "knn_topk_split.cake").value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk


@pytest.mark.gpu
@pytest.mark.parametrize("split", [4, 2])
def test_knn_split_passes_the_gate_on_ragged_and_empty_splits(split, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _build(split, tmp_path)
    runs = check_and_time(compiled, lk, KNN, list(ALIGNED.shapes) + EXTRA, seed=21, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("split", [4, 3, 2])
def test_knn_split_passes_the_gate_at_the_headline_shape(split, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _build(split, tmp_path)
    (r,) = check_and_time(compiled, lk, KNN, [HEADLINE], seed=22, reps=10, timeout_s=120,
                          rows=256)
    assert r.correct, r.message
    print(f"\nknn_topk_split SPLIT={split} {HEADLINE}: median {r.median_ms} ms (p10 {r.p10_ms}, p90 {r.p90_ms}, "
          f"{r.timer}, L2 {r.l2})")


@pytest.mark.gpu
@pytest.mark.parametrize("split", [4, 3])     # 3: knn_topk_split_pp3, the best-known program
def test_knn_split_pp_passes_the_gate_on_ragged_and_odd_shares(split, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _build(split, tmp_path, PP)
    runs = check_and_time(compiled, lk, KNN, list(ALIGNED.shapes) + EXTRA + PP_EXTRA, seed=23, time=False,
                          timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("split", [4, 3])
def test_knn_split_pp_passes_the_gate_at_the_headline_shape(split, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _build(split, tmp_path, PP)
    (r,) = check_and_time(compiled, lk, KNN, [HEADLINE], seed=22, reps=10, timeout_s=120,
                          rows=256)
    assert r.correct, r.message
    print(f"\nknn_topk_split_pp SPLIT={split} {HEADLINE}: median {r.median_ms} ms (p10 {r.p10_ms}, p90 {r.p90_ms}, "
          f"{r.timer}, L2 {r.l2})")
