"""The split-K tinygemm program: the CPU interpreter against the oracle, the lowering of atomic_add from a
wgmma accumulator (red.global.add.v4/v2.f32), and an nvcc compile for sm_90a (no GPU)."""
from __future__ import annotations


import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from ptx import ptx_of

TINY = get_problem("tinygemm")
NAME = "tinygemm_splitk.cake"
TEXT = dict(zip(TINY.best_files, TINY.best_texts()))[NAME]
ALIGNED = TINY.shape_set("tinygemm_aligned")


def _lower(text: str = TEXT):
    return lower(parse_program(text, NAME), NAME)


def test_splitk_program_verifies_and_is_a_best_file():
    assert NAME in TINY.best_files and "c" in TINY.zeroed_outputs
    assert not [d for d in check_text(TEXT, NAME) if d.is_error]


def test_splitk_matches_the_oracle_in_the_interpreter_on_the_aligned_set():
    assert set(ALIGNED.roles) == {"headline", "tail", "held_out"}
    checks = check_on_cpu(parse_program(TEXT, NAME), TINY, list(ALIGNED.shapes), seed=3)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


@pytest.mark.parametrize("ctas", [1, 4, 1000])
def test_splitk_is_correct_for_any_split(ctas):
    # CTAS=1: one K slice, the 8-stage ring wraps (K = 1000: 16 K tiles); 4: a ragged last slice;
    # 1000: one K tile per CTA. M = 70: two 64-row tiles (grid z), rows past M zero-filled
    text = TEXT.replace('"CTAS": 132', f'"CTAS": {ctas}')
    shapes = [{"M": 70, "N": 40, "K": 1000}, {"M": 3, "N": 136, "K": 200}]
    checks = check_on_cpu(parse_program(text, NAME), TINY, shapes, seed=4)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_grid_spreads_k_over_about_one_cta_per_sm():
    lk = _lower().value
    assert lk.grid_for({"M": 1, "N": 4096, "K": 4096}) == (32, 4, 1)        # 128 CTAs, 16 K tiles each
    assert lk.grid_for({"M": 64, "N": 8192, "K": 8192}) == (64, 2, 1)       # 128 CTAs, 64 K tiles each
    assert lk.grid_for({"M": 1, "N": 11008, "K": 4096}) == (86, 1, 1)       # enough N tiles: no split
    assert lk.grid_for({"M": 3, "N": 8, "K": 8}) == (1, 1, 1)


def test_atomic_add_of_a_wgmma_accumulator_lowers_to_the_fragment_helper():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert "cake::atomic_add_gmem_wgmma_acc<128, true>(c + " in src
    assert "if (cake_acc_fresh) cake::fill_rmem(acc, 0.0f);" in src      # a CTA whose loop ran no trip adds 0
    assert "atomic_add_gmem(" not in src                                  # not the CTA-wide distribution
    assert r.value.smem_bytes == 8 * (8192 + 16384) + 128


def test_other_atomic_add_inside_a_role_is_refused():
    text = TEXT.replace("        atomic_add(c[tile(bid.z, BM), tile(bid.x, BN)], acc)",
                        "        part = rmem(f32, (BM, 4))\n        atomic_add(c[tile(bid.z, BM), tile(bid.x, 4)], part)")
    r = _lower(text)
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.rule in ("lower.unsupported_in_role", "lower.shape_mismatch") for d in r.diagnostics), r.diagnostics


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_splitk_compiles_for_sm_90a_with_vector_reductions(tmp_path):
    r = compile_kernel(_lower().value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log and "C7510" not in log and "C7515" not in log   # wgmma not serialised
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 128
    ptx = ptx_of(_lower().value.source, tmp_path)
    for needle in ("red.global.add.v4.f32", "red.global.add.v2.f32", "shfl.sync.bfly",
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d"):
        assert needle in ptx, needle
