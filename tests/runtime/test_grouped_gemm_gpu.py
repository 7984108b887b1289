"""The grouped GEMM's naive seed through check_and_time on the GPU (marked `gpu`): fresh random inputs per shape
(a hot expert with every token, a cold one with none), the fp64 oracle, the perturbation check, on two decode rows
of grouped_gemm_decode (E = 128 and E = 512 experts) and the small set; a planted mistake in the group bounds is
called wrong. y is zeroed before each launch: the seed adds its tiles into it with scatter_add.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_grouped_gemm_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem

pytestmark = pytest.mark.gpu

P = get_problem("grouped_gemm")
SEED = P.seed_text()
DECODE = [{"T": 16, "topk": 8, "E": 128, "K": 2048, "N": 768}, {"T": 128, "topk": 10, "E": 512, "K": 2048, "N": 256}]


def _built(text: str, tmp_path):
    lk = lower(parse_program(text, P.seed_file), P.seed_file)
    assert lk.ok, [d.message for d in lk.diagnostics]
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk.value


def test_the_seed_passes_the_gate_on_decode_and_small_shapes(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    assert all(s in P.shape_set("grouped_gemm_decode").shapes for s in DECODE)
    compiled, lk = _built(SEED, tmp_path)
    runs = check_and_time(compiled, lk, P, DECODE + list(P.shape_set("grouped_gemm_small").shapes), seed=5,
                          time=False, timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.outcome == "checked" and r.max_error < P.rtol for r in runs)


def test_a_ragged_tile_that_runs_into_the_next_group_fails_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    assert SEED.count("limit=end") == 2
    compiled, lk = _built(SEED.replace("limit=end", "limit=T * topk"), tmp_path)
    runs = check_and_time(compiled, lk, P, DECODE, seed=6, time=False, timeout_s=30)
    assert all(r.outcome == "wrong" for r in runs), [(r.shape, r.outcome, r.message) for r in runs]
