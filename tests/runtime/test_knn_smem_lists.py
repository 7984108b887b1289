"""The split KNN kernels whose topk_bias lists live in shared memory (KMAX 64 and 128: k up to 128, which register
lists cannot hold): the GPU gate on ragged query tiles, empty and ragged database shares, D not a multiple of 8,
batches, k at and below KMAX (marked `gpu`). Their CPU checks: the rules and the
interpreter in tests/ir/test_topk_smem.py, the lowering and nvcc in tests/lower/test_lower_topk_smem.py.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_knn_smem_lists.py -q -s -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import corpus_file, get_problem

# ragged query tiles (70, 130), empty shares (300 rows: 3 tiles over 8 CTAs), one row per share, odd D
SEARCH = [{"B": 2, "Q": 70, "M": 1100, "D": 40, "k": 64, "S": 2}, {"B": 1, "Q": 3, "M": 300, "D": 8, "k": 50, "S": 2},
          {"B": 1, "Q": 130, "M": 100_003, "D": 128, "k": 64, "S": 2},
          {"B": 1, "Q": 64, "M": 65536, "D": 257, "k": 33, "S": 2}]
BUILD = [{"Q": 70, "N": 1100, "D": 40, "k": 64}, {"Q": 130, "N": 300, "D": 128, "k": 20},
         {"Q": 1024, "N": 1024, "D": 128, "k": 64}]


def _compiled(file: str, tmp):
    lk = lower(parse_program(corpus_file(file).read_text(), file), file).value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk


@pytest.mark.gpu
@pytest.mark.parametrize("file,problem,shapes,wide", [
    ("knn_search_split_k64.cake", "knn_search", SEARCH, []),
    ("knn_search_split_k128.cake", "knn_search", SEARCH, [{"B": 1, "Q": 200, "M": 5000, "D": 64, "k": 128, "S": 2}]),
    ("knn_topk_split_k64.cake", "knn_topk", BUILD, []),
    ("knn_topk_split_k128.cake", "knn_topk", BUILD, [{"Q": 300, "N": 20000, "D": 96, "k": 100}]),
])
def test_smem_list_kernels_pass_the_gate(file, problem, shapes, wide, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _compiled(file, tmp_path)
    runs = check_and_time(compiled, lk, get_problem(problem), shapes + wide, seed=31, time=False, timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
