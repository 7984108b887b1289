"""tile_order lowered onto cake::tile_order (header/cake.cuh) and compiled with nvcc; on the H200 (marked
`gpu`) the persistent GEMM with tile_order passes the gate as the seed does.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/lower/test_lower_tile_order.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import sibling
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem

_ir = sibling.load(Path(__file__).parents[1] / "ir" / "test_tile_order.py")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def test_it_lowers_to_the_header_function_and_the_rest_is_the_seeds():
    seed, ours = (lower(parse_program(t)) for t in (_ir.SEED, _ir.with_tile_order()))
    assert seed.outcome is ours.outcome is Outcome.OK
    src = ours.value.source
    assert src.count("int tm, tn;  // tile_order: grouped tile coordinates") == 2
    assert src.count("cake::tile_order(tm, tn, t, cake_cdiv(M, BM), cake_cdiv(N, BN), 16);") == 2  # G = 16
    assert ours.value.tensor_maps == seed.value.tensor_maps and ours.value.smem_bytes == seed.value.smem_bytes


def test_a_group_that_is_not_a_positive_constant_is_refused_at_its_line():
    for group in ("0", "M"):
        text = _ir.with_tile_order().replace("group=G)", f"group={group})", 1)
        r = lower(parse_program(text))
        assert r.outcome is Outcome.COMPILE_FAILED
        d = r.diagnostics[0]           # (then the uses of its unbound names)
        assert d.rule == "lower.dynamic_shape" and "tile_order's group" in d.message
        assert d.line == _ir.order_lines(text)[0]


def test_a_name_the_kernel_already_uses_is_refused():
    text = _ir.with_tile_order().replace("tile_order(tm, tn, t,", "tile_order(t, tn, t,", 1)
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED and r.diagnostics[0].rule == "lower.shadowed_name"
    assert "`t` shadows" in r.diagnostics[0].message and r.diagnostics[0].line == _ir.order_lines(text)[0]


@needs_nvcc
def test_it_compiles_for_sm_90a_without_spills(tmp_path):
    lk = lower(parse_program(_ir.with_tile_order()))
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.metrics["spill_bytes"] == 0


@needs_nvcc
def test_the_toy_compiles(tmp_path):
    cr = compile_kernel(lower(_ir._toy()).value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]


@pytest.mark.gpu
def test_the_persistent_gemm_with_tile_order_passes_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    lk = lower(parse_program(_ir.with_tile_order())).value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    shapes = [{"M": 129, "N": 264, "K": 520}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72},
              {"M": 4096, "N": 4096, "K": 4096}]
    runs = check_and_time(cr.value, lk, get_problem("gemm_bf16"), shapes, seed=21, time=False, timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
