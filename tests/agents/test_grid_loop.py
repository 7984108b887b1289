"""grid_loop: an independent top-level loop's trips spread over CTAs. It applies to the MoE seed (the expert loop,
then the intermediate-tile loop: a new grid dimension each) and to a toy row gather, and the results pass the
CPU gate and compile; it folds into z when the grid has three dimensions; it refuses, with the reason, a loop
that carries state, whose extent is not a grid extent, that stores one window on every trip, whose last trip
is read after it, or beside an atomic add that would run once per CTA."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import sibling
from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import apply
from cake_core.ir import interp
from cake_core.ir.expr import Sym
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

_ir = sibling.load(Path(__file__).parents[1] / "ir" / "test_scalar.py")

MOE = get_problem("moe")
MOE_SHAPES = [{"M": 3, "H": 72, "I": 40, "E": 12, "k": 3}, {"M": 4, "H": 200, "I": 136, "E": 8, "k": 2}]


def _apply(p, seed=0):
    out = apply("grid_loop", p, np.random.default_rng(seed))
    assert not isinstance(out, Refused), out.reason
    return out


def _refusal(p) -> str:
    out = apply("grid_loop", p, np.random.default_rng(0))
    assert isinstance(out, Refused), out.text()
    return out.reason


def test_the_moe_seed_spreads_its_experts_then_its_intermediate_tiles_over_ctas(tmp_path):
    seed = parse_program(MOE.seed_text())
    once = _apply(seed)
    twice = _apply(once)
    assert once.grid == (Sym("M"), Sym("k")) and "scalar(e, top_i[0, bid.y], max=E - 1)" in once.text()
    assert twice.grid[:2] == once.grid and "cdiv(I, BI)" in str(twice.text().splitlines()[0])
    assert "for j in" not in twice.text() and "for it in" not in twice.text()
    for p in (once, twice):
        assert parse_program(p.text()) == p
        assert not [d for d in verify(p, shapes=MOE_SHAPES) if d.is_error]
        checks = check_on_cpu(p, MOE, MOE_SHAPES, seed=3, strict=True)
        assert all(c.correct for c in checks), [c.message for c in checks]
        low = lower(p, "moe.cake")
        assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]
    if shutil.which("nvcc"):
        from cake_core.lower.compile import compile_kernel
        comp = compile_kernel(lower(twice, "moe.cake").value, arch="sm_90a", cache_dir=tmp_path)
        assert comp.outcome is Outcome.OK, comp.artifacts.get("log", "")[-2000:]


def test_the_row_gather_toy_gets_a_ctas_per_column_tile_and_the_same_answer():
    p = _apply(parse_program(_ir.GATHER))
    assert len(p.grid) == 2 and "for c in" not in p.text() and "tile(bid.y, BC)" in p.text()
    rng = np.random.default_rng(1)
    M, N, C = 5, 9, 70
    x = rng.normal(size=(N, C)).astype(np.float32)
    ids = rng.integers(0, N, M).astype(np.int32)
    got = interp.run(p, {"M": M, "N": N, "C": C}, {"ids": ids, "x": x}, {"y": np.full((M, C), np.nan, np.float32)})
    np.testing.assert_array_equal(got["y"], x[ids])


def test_a_three_dimensional_grid_folds_the_trips_into_z():
    text = _ir.GATHER.replace('grid=(M,)', 'grid=(M, 1, 2)')
    p = _apply(parse_program(text))
    assert len(p.grid) == 3 and "bid.z % cdiv(C, BC)" in p.text() and "2 * cdiv(C, BC)" in p.text()
    rng = np.random.default_rng(2)
    M, N, C = 3, 4, 40
    x = rng.normal(size=(N, C)).astype(np.float32)
    ids = rng.integers(0, N, M).astype(np.int32)
    got = interp.run(p, {"M": M, "N": N, "C": C}, {"ids": ids, "x": x}, {"y": np.full((M, C), np.nan, np.float32)})
    np.testing.assert_array_equal(got["y"], x[ids])


@pytest.mark.parametrize("prob, reason", [
    ("gemm_bf16", "reads `acc` before the trip writes it: carried from the trip before"),
    ("knn_topk", "reads `top_v` before the trip writes it"),
    ("kda_varlen", "its extent eos - bos is not a grid extent"),
    ("kmeans_update", "outside the loop, would add once per CTA"),
])
def test_it_refuses_a_seed_whose_loop_is_not_independent(prob, reason):
    assert reason in _refusal(parse_program(get_problem(prob).seed_text()))


def test_the_kda_decode_seeds_value_tiles_go_to_the_grid_and_stay_correct():
    problem = get_problem("kda_decode")
    p = _apply(parse_program(problem.seed_text()))
    assert len(p.grid) == 3 and "for vt in" not in p.text() and "tile(bid.z, BV)" in p.text()
    shapes = [{"B": 2, "H": 3, "DK": 64, "DV": 64}, {"B": 3, "H": 2, "DK": 40, "DV": 72},
              {"B": 1, "H": 2, "DK": 128, "DV": 128}]
    for q in (p, p.with_consts(BV=32)):
        assert not [d for d in verify(q, shapes=shapes) if d.is_error]
        checks = check_on_cpu(q, problem, shapes, seed=2, strict=True)
        assert all(c.correct for c in checks), [c.message for c in checks]


def test_it_refuses_a_loop_that_stores_one_window_on_every_trip():
    text = _ir.GATHER.replace("store(y[tile(bid.x, 1), tile(c, BC)], r)", "store(y[tile(bid.x, 1), tile(0, BC)], r)")
    assert "writes y[tile(bid.x, 1), tile(0, BC)] on every trip" in _refusal(parse_program(text))


def test_it_refuses_a_loop_whose_last_trip_is_read_after_it():
    text = _ir.GATHER.replace("        store(y[tile(bid.x, 1), tile(c, BC)], r)\n        sync()\n", "        sync()\n") \
        + "    store(y[tile(bid.x, 1), tile(0, BC)], r)\n"
    assert "reads after the loop what its last trip left" in _refusal(parse_program(text))
