"""``grid_order``: the CTA coordinate that tiles the largest tensor's contiguous axis moves to the grid's x
dimension (CTAs launched together then read whole rows). The evolved KDA decode kernel, whose value-column
blocks were the grid's z, is reordered, passes the strict CPU gate and compiles; a toy copy gives the same
answer; it refuses a kernel already in that order, a one-dimensional grid, and extents that would pass CUDA's
65535 along y or z."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import STRUCTURAL, apply
from cake_core.ir import interp
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

DECODE = Path(__file__).parents[2] / "bench/results/programs/kda-decode-h100-2026-12-06-evolved.cake"
DECODE_SHAPES = [{"B": 2, "H": 3, "DK": 128, "DV": 64}, {"B": 1, "H": 2, "DK": 128, "DV": 96}]
LARGEST = {"B": 256, "H": 32, "DK": 128, "DV": 128}

# rows along x, column blocks along y: one row's blocks are launched far apart
TOY = '''@kernel(target="sm_90a", grid=(M, cdiv(N, BN)), threads=128, consts={"BN": 32})
def copy_scaled(x: gmem[f32, (M, N)], y: gmem[f32, (M, N)]):
    t = smem(f32, (1, BN))
    load(t, x[tile(bid.x, 1), tile(bid.y, BN)])
    sync()
    unary(t, t, fn="exp")
    sync()
    store(y[tile(bid.x, 1), tile(bid.y, BN)], t)
'''


def _order(p, bounds=None):
    return apply("grid_order", p, np.random.default_rng(0), bounds)


def test_grid_order_is_a_structural_tactic():
    assert "grid_order" in STRUCTURAL


def test_the_decode_kernel_s_state_blocks_move_to_x_and_it_stays_correct(tmp_path):
    p = parse_program(DECODE.read_text(), DECODE.name)
    out = _order(p, LARGEST)
    assert not isinstance(out, Refused), out.reason
    assert out.grid == parse_program(DECODE.read_text().replace("grid=(H, B, cdiv(DV, BV))",
                                                                "grid=(cdiv(DV, BV), H, B)")).grid
    text = out.text()
    assert "s[bid.z, bid.y, tile(0, TK), tile(bid.x, BV)]" in text and "q[bid.z, tile(bid.y, 1), tile(0, TK)]" in text
    assert parse_program(text) == out
    problem = get_problem("kda_decode")
    assert not [d for d in verify(out, shapes=DECODE_SHAPES) if d.is_error]
    checks = check_on_cpu(out, problem, DECODE_SHAPES, seed=6, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(out, "ordered.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]
    assert "blockIdx.x) * BV" in low.value.source
    if shutil.which("nvcc"):
        from cake_core.lower.compile import compile_kernel
        comp = compile_kernel(low.value, arch="sm_90a", cache_dir=tmp_path)
        assert comp.outcome is Outcome.OK, [d.message for d in comp.diagnostics]


def test_the_toy_copy_gives_the_same_answer_in_the_new_order():
    p = parse_program(TOY)
    out = _order(p)
    assert not isinstance(out, Refused), out.reason
    assert "grid=(cdiv(N, BN), M)" in out.text() and "x[tile(bid.y, 1), tile(bid.x, BN)]" in out.text()
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 70)).astype(np.float32)
    runs = [interp.run(q, {"M": 5, "N": 70}, {"x": x}, {"y": np.full((5, 70), np.nan, np.float32)})["y"]
            for q in (p, out)]
    np.testing.assert_array_equal(runs[1], runs[0])
    np.testing.assert_allclose(runs[0], np.exp(x), rtol=1e-6)


def test_it_refuses_a_kernel_already_in_that_order():
    out = _order(parse_program(get_problem("gemm_bf16").seed_text()))
    assert isinstance(out, Refused) and "`c`'s innermost axis is already tiled along x" in out.reason
    again = _order(_order(parse_program(TOY)))
    assert isinstance(again, Refused) and "already tiled along x" in again.reason


def test_it_refuses_a_one_dimensional_grid():
    out = _order(parse_program(TOY.replace("grid=(M, cdiv(N, BN))", "grid=(M,)").replace("tile(bid.y, BN)",
                                                                                           "tile(0, BN)")))
    assert isinstance(out, Refused) and "a grid of 1 dimension" in out.reason


def test_it_refuses_to_put_more_than_65535_ctas_on_y():
    out = _order(parse_program(TOY), {"M": 70000, "N": 64})
    assert isinstance(out, Refused) and "M = 70000 CTAs along y" in out.reason and "65535" in out.reason
    assert not isinstance(_order(parse_program(TOY), {"M": 65535, "N": 64}), Refused)


def test_it_applies_to_the_grouped_gemm_seed_and_the_split_kda_prefill_seed():
    gg = parse_program(get_problem("grouped_gemm").seed_text())
    out = _order(gg)
    assert not isinstance(out, Refused), out.reason
    assert out.text().startswith('@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(T, BM), E)')
    assert "w[bid.z, tile(kt, BK), tile(bid.x, BN)]" in out.text() and "offsets[bid.z]" in out.text()
    split = apply("split_state", parse_program(get_problem("kda_prefill").seed_text()), np.random.default_rng(0))
    out = _order(split, {"B": 8, "T": 1024, "H": 64, "DK": 128, "DV": 128})
    assert not isinstance(out, Refused), out.reason
    assert out.grid[0] == split.grid[2] and out.grid[1:] == split.grid[:2]
