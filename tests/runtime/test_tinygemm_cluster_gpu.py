"""The tinygemm programs that store each element of C once (split-K over clusters, partial sums reduced through
distributed smem; and tinygemm_rows, no split) through check_and_time on the H200 (marked `gpu`): correct over a
poisoned C with no zeroing launch, on the aligned small set, ragged extras and tinygemm_decode, then timed beside
the atomics split-K program.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_tinygemm_cluster_gpu.py -q -s -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from cake_core.problems import corpus_file

TINY = get_problem("tinygemm")
EXTRA = [{"M": 70, "N": 200, "K": 1000}, {"M": 64, "N": 264, "K": 8}, {"M": 2, "N": 36000, "K": 128}]
HEADLINE = [{"M": m, "N": n, "K": n} for n in (4096, 8192) for m in (1, 16, 64)]


def _build(name: str, tmp):
    text = corpus_file(name).read_text()
    lk = lower(parse_program(text, name), name)
    assert lk.ok, lk.diagnostics
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk.value


@pytest.fixture(scope="module", params=["tinygemm_cluster.cake", "tinygemm_cluster2.cake", "tinygemm_rows.cake",
                                        "tinygemm_cluster2_rows.cake"])
def cluster_built(request, tmp_path_factory):
    # clusters of 8 (the first program), and of 2 with 128-column tiles (one wave of 128 CTAs at N = 8192);
    # no cluster and no split (64-column tiles over all of K); clusters of 2 with 64-column tiles (one wave
    # at N = 4096); the last two load only 8 or 16 rows of A where M is that small
    return _build(request.param, tmp_path_factory.mktemp("cubins"))


@pytest.mark.gpu
def test_cluster_passes_the_gate_over_a_poisoned_c(cluster_built):
    from cake_core.runtime.gpu import check_and_time, gpu_model
    assert "H200" in (gpu_model() or "") or "H100" in (gpu_model() or "")
    compiled, lk = cluster_built
    assert TINY.zeroed_for(lk.accumulates) == ()          # c is poisoned before each run, never zeroed
    decode = TINY.shape_set("tinygemm_decode")
    shapes = list(TINY.shape_set("tinygemm_aligned").shapes) + EXTRA + list(decode.shapes)
    runs = check_and_time(compiled, lk, TINY, shapes, seed=5, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
def test_cluster_is_timed_beside_the_atomics_split_k(cluster_built, tmp_path):
    # prints both programs' medians at the headline cells (with -s); the cluster program's timed region has
    # no zeroing launch. Predicted: 10-12 us at N = K = 4096, 34-37 us at 8192 (splitk: 17 / 42-44 us)
    from cake_core.runtime.gpu import check_and_time
    splitk = _build("tinygemm_splitk.cake", tmp_path)
    times = {}
    for name, (compiled, lk) in (("cluster", cluster_built), ("splitk", splitk)):
        runs = check_and_time(compiled, lk, TINY, HEADLINE, seed=6, reps=30, timeout_s=20)
        for r in runs:
            assert r.correct and r.outcome == "measured", r.message
            times[(name, shape_key(r.shape))] = r.median_ms * 1e3
    for s in HEADLINE:
        key = shape_key(s)
        print(f"{key}: cluster {times[('cluster', key)]:.1f} us, splitk {times[('splitk', key)]:.1f} us")
    assert all(v > 0 for v in times.values())
