"""The warp-specialised attention (mha_ws.cake: wgmma S = Q K^T, an online softmax on S's fragments with row
vectors, P cast to bf16 in registers, O += P V with P as wgmma's register A) through check_and_time on the GPU
(marked `gpu`): the small set (ragged T and DH, one token, held out), longer sequences, and planted mistakes of
the new layouts that the gate must call wrong.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_mha_ws_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

import numpy as np

import sibling
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_fragments = sibling.load(_here.parent / "lower" / "test_lower_role_fragments.py")
_swizzle = sibling.load(_here.parent / "ir" / "test_swizzle_layout.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")

MHA = get_problem("mha")
WS = MHA.kernel_text("mha_ws.cake")
# beyond the small set: many key tiles with a ragged last one, a full 128-row query tile, DH at the bound
EXTRA = [{"H": 3, "T": 1000, "DH": 128}, {"H": 2, "T": 256, "DH": 64}, {"H": 1, "T": 129, "DH": 96}]


def _built(text: str, tmp_path):
    lk = lower(parse_program(text, "mha_ws.cake"), "mha_ws.cake")
    assert lk.ok, [d.message for d in lk.diagnostics]
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk.value


def test_the_warp_specialised_attention_passes_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _built(WS, tmp_path)
    runs = check_and_time(compiled, lk, MHA, list(MHA.shape_set("mha_small").shapes) + EXTRA, seed=7, time=False,
                          timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.parametrize("old,new", [
    ('            ewise(acc, acc, alpha, fn="mul")\n', ""),                       # the rescale dropped
    ("            reduce(rsum, s, axis=1)\n", '            reduce(rsum, s, axis=1, fn="max")\n'),   # a wrong sum
    ("            wgmma(acc, p, v_s[j % S])\n", "            wgmma(acc, p, v_s[0])\n"),   # a stale V slot
], ids=["no_rescale", "max_for_sum", "stale_v"])
def test_a_planted_mistake_fails_the_gate(old, new, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    assert old in WS
    compiled, lk = _built(WS.replace(old, new, 1), tmp_path)
    runs = check_and_time(compiled, lk, MHA, [{"H": 2, "T": 300, "DH": 128}], seed=8, time=False, timeout_s=30)
    assert not any(r.correct for r in runs)


def test_the_attention_through_shared_memory_passes_the_gate(tmp_path):
    # P cast into a swizzled smem tile (the swizzle TMA and wgmma use), fence_async(), role_sync(), then the wgmma
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = _built(_fragments._through_smem(), tmp_path)
    runs = check_and_time(compiled, lk, MHA, [{"H": 2, "T": 300, "DH": 128}, {"H": 1, "T": 45, "DH": 64}], seed=9,
                          time=False, timeout_s=30)
    assert all(r.correct for r in runs), [(r.shape, r.message) for r in runs]


def test_an_elementwise_op_reads_a_tma_filled_swizzled_tile_at_its_elements(tmp_path):
    x = bf16_round(np.random.default_rng(11).normal(size=(64, 64)).astype(np.float32))
    _gpu._agree(_swizzle.KERNEL, {"M": 64, "N": 64}, {"x": x}, tmp_path)


@pytest.mark.parametrize("then", [[], ["pipeline_wgmma"], ["persistent"]], ids=["ws", "ws+pipeline", "ws+persistent"])
def test_what_warp_specialize_makes_of_the_seed_passes_the_gate(then, tmp_path):
    # the chained mainloop's warp specialisation (agents/chained.py), and two structural steps after it
    from cake_core.agents.tactics import apply
    from cake_core.runtime.gpu import check_and_time
    p = apply("warp_specialize", parse_program(MHA.seed_text(), "mha.cake"), np.random.default_rng(0))
    for name in then:
        p = apply(name, p, np.random.default_rng(0), {"H": 32, "T": 1000, "DH": 128})
        assert not hasattr(p, "reason"), p.reason
    compiled, lk = _built(p.text(), tmp_path)
    runs = check_and_time(compiled, lk, MHA, list(MHA.shape_set("mha_small").shapes) + EXTRA, seed=10, time=False,
                          timeout_s=30)
    assert all(r.correct for r in runs), [(r.shape, r.message) for r in runs if not r.correct]
