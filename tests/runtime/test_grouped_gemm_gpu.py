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


@pytest.mark.parametrize("chain", [["mma_sync"], ["split_k"], ["mma_sync", "split_k"], ["prefetch", "mma_sync"],
                                   ["split_k", "prefetch", "mma_sync"]])
def test_the_structural_tactics_children_of_the_seed_pass_the_gate(tmp_path, chain):
    # mma_sync (its accumulator scattered in the fragment layout), split_k (the reduction over a folded z: partial
    # sums scatter-added into the zeroed y), prefetch (cp.async a trip ahead), and their chains
    import numpy as np
    from cake_core.agents.tactics import apply
    from cake_core.runtime.gpu import check_and_time
    p = parse_program(SEED, P.seed_file)
    for t in chain:
        p = apply(t, p, np.random.default_rng(1))
        assert not hasattr(p, "reason"), (t, p.reason)
    compiled, lk = _built(p.text(), tmp_path)
    runs = check_and_time(compiled, lk, P, DECODE + list(P.shape_set("grouped_gemm_small").shapes), seed=7,
                          time=False, timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


def test_split_k_of_the_tensor_core_tinygemm_seed_passes_the_gate(tmp_path):
    # atomic_add from an mma_sync accumulator (cake::store_gmem_mma_acc with ADD), beside the plain split
    import numpy as np
    from cake_core.agents.tactics import apply
    from cake_core.runtime.gpu import check_and_time
    tiny = get_problem("tinygemm")
    for chain in (["split_k"], ["mma_sync", "split_k"]):
        p = parse_program(tiny.seed_text(), tiny.seed_file)
        for t in chain:
            p = apply(t, p, np.random.default_rng(2))
        lk = lower(p, tiny.seed_file)
        assert lk.ok, [d.message for d in lk.diagnostics]
        cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
        assert cr.ok, [d.message for d in cr.diagnostics]
        shapes = list(tiny.shape_set(tiny.shape_sets[0]).shapes)[:4]
        runs = check_and_time(cr.value, lk.value, tiny, shapes, seed=8, time=False, timeout_s=30)
        assert all(r.correct for r in runs), (chain, [(r.shape, r.outcome, r.message) for r in runs])
