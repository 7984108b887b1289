"""Chunked scans: ``find_scan`` recognises the loop and its carried state in the KDA seeds and chunked kernels, and
``split_state`` cuts the state's independent columns into blocks, a CTA each. The split kernels pass the CPU gate
(on value widths the unsplit kernels do not serve too) and compile; it refuses, with the reason, a state whose
columns meet (a row sum), a window that does not start at 0, a loop that carries nothing, a kernel that already
reads the new dimension's coordinate; on a three-dimensional grid the blocks fold into z."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.scan import find_scan
from cake_core.agents.tactics import STRUCTURAL, apply
from cake_core.ir import interp
from cake_core.ir.expr import Sym
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

PREFILL = [{"B": 2, "T": 70, "H": 2, "DK": 64, "DV": 72}, {"B": 1, "T": 9, "H": 3, "DK": 32, "DV": 48},
           {"B": 1, "T": 5, "H": 1, "DK": 128, "DV": 130}]
VARLEN = [{"N": 4, "T": 80, "H": 1, "DK": 40, "DV": 72}, {"N": 1, "T": 5, "H": 2, "DK": 128, "DV": 136}]
KERNELS = [("kda_prefill", None, PREFILL), ("kda_prefill", "kda_prefill_chunked.cake", PREFILL),
           ("kda_varlen", None, VARLEN), ("kda_varlen", "kda_varlen_chunked.cake", VARLEN)]

# A running column sum: the state's columns never meet, so they split.
TOY = '''@kernel(target="sm_90a", grid=(B,), threads=128, consts={"BT": 16, "TV": 64})
def colsum(x: gmem[f32, (B, T, D)], s: gmem[f32, (B, D)], o: gmem[f32, (B, T, D)]):
    st = smem(f32, (1, TV))
    xt = smem(f32, (BT, TV))
    cs = smem(f32, (1, TV))
    load(st, s[tile(bid.x, 1), tile(0, TV)])
    sync()
    for c in range(cdiv(T, BT)):
        load(xt, x[bid.x, tile(c, BT), tile(0, TV)])
        sync()
        ewise(xt, xt, st)
        reduce(cs, xt, axis=0)
        sync()
        ewise(st, st, cs)
        sync()
        store(o[bid.x, tile(c, BT), tile(0, TV)], xt)
        sync()
    store(s[tile(bid.x, 1), tile(0, TV)], st)
'''


def _program(prob: str, kernel: str | None):
    problem = get_problem(prob)
    if kernel is None:
        return problem, parse_program(problem.seed_text())
    assert kernel in problem.kernel_files()
    return problem, parse_program((problem.kernels_dir / kernel).read_text(), kernel)


def _passes(p, problem, shapes, compile_in=None) -> None:
    """Verified, right on the CPU gate (strict), lowered, and compiled by nvcc into ``compile_in`` when given."""
    assert not [d for d in verify(p, shapes=shapes) if d.is_error]
    checks = check_on_cpu(p, problem, shapes, seed=4, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(p, "split.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]
    if compile_in is not None and shutil.which("nvcc"):
        from cake_core.lower.compile import compile_kernel
        comp = compile_kernel(low.value, arch="sm_90a", cache_dir=compile_in)
        assert comp.outcome is Outcome.OK, [d.message for d in comp.diagnostics]


def _refusal(text: str) -> str:
    out = apply("split_state", parse_program(text), np.random.default_rng(0))
    assert isinstance(out, Refused), out.text()
    return out.reason


@pytest.mark.parametrize("prob, kernel, shapes", KERNELS)
def test_find_scan_sees_the_state_the_streamed_inputs_and_the_outputs(prob, kernel, shapes):
    _, p = _program(prob, kernel)
    scan = find_scan(p)
    assert scan.carried == ("s_t",)
    assert {n.arg("src").buf for n in scan.streamed} == {"q", "k", "v", "g", "beta"}
    assert [n.arg("dst").buf for n in scan.emitted] == ["o"]


@pytest.mark.parametrize("prob, kernel, shapes", KERNELS)
def test_split_state_cuts_the_value_columns_and_the_kernel_stays_correct(prob, kernel, shapes, tmp_path):
    problem, p = _program(prob, kernel)
    out = apply("split_state", p, np.random.default_rng(0))
    assert not isinstance(out, Refused), out.reason
    assert out.grid[:2] == p.grid and len(out.grid) == 3 and out.const_env["BV"] == 64
    assert "tile(bid.z, BV)" in out.text() and "tile(0, TV)" not in out.text()
    assert parse_program(out.text()) == out
    _passes(out.with_consts(BV=32), problem, shapes)
    _passes(out, problem, shapes, compile_in=tmp_path if kernel else None)


def test_a_staging_tile_reused_for_keys_and_values_gets_a_narrow_twin_for_the_values():
    _, p = _program("kda_prefill", "kda_prefill_chunked.cake")
    out = apply("split_state", p, np.random.default_rng(0))
    text = out.text()
    assert "x_b = smem(bf16, (BT, TK))" in text and "x_b_b = smem(bf16, (BT, BV))" in text
    assert "load(x_b_b, v[" in text and "load(x_b, k[" in text and "load(x_b, q[" in text


def test_the_toy_column_sum_splits_and_gives_the_same_answer():
    p = parse_program(TOY)
    out = apply("split_state", p, np.random.default_rng(0))
    assert not isinstance(out, Refused), out.reason
    assert out.grid == (Sym("B"), parse_program(TOY.replace("grid=(B,)", "grid=(B, cdiv(D, BV))")).grid[1])
    _same_answer(p, out)


def _same_answer(p, out) -> None:
    rng = np.random.default_rng(5)
    B, T, D = 2, 37, 50
    x, s = rng.normal(size=(B, T, D)).astype(np.float32), rng.normal(size=(B, D)).astype(np.float32)
    dims = {"B": B, "T": T, "D": D}
    want = interp.run(p, dims, {"x": x}, {"s": s.copy(), "o": np.full((B, T, D), np.nan, np.float32)})
    got = interp.run(out, dims, {"x": x}, {"s": s.copy(), "o": np.full((B, T, D), np.nan, np.float32)})
    for name in ("s", "o"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_it_refuses_a_state_whose_columns_meet():
    text = TOY.replace("cs = smem(f32, (1, TV))", "cs = smem(f32, (1, 1))") \
        .replace("reduce(cs, xt, axis=0)", "reduce(cs, st, axis=1)")
    why = _refusal(text)
    assert "axis 1: the columns meet: `reduce` (line 12) runs along it" in why


def test_it_refuses_a_window_that_does_not_start_at_zero():
    text = TOY.replace("store(o[bid.x, tile(c, BT), tile(0, TV)], xt)", "store(o[bid.x, tile(c, BT), tile(1, TV)], xt)")
    assert "`o` is indexed along it at line 16 other than tile(0, 64)" in _refusal(text)


def test_it_refuses_a_loop_that_carries_nothing():
    assert "carries nothing from trip to trip" in _refusal(get_problem("kda_decode").seed_text())
    reads_y = TOY.replace("tile(bid.x, 1), tile(0, TV)]", "tile(bid.x + bid.y, 1), tile(0, TV)]")
    assert "the kernel reads bid.y" in _refusal(reads_y)
    assert "split_state" in STRUCTURAL


def test_on_a_three_dimensional_grid_the_blocks_fold_into_z():
    p = parse_program(TOY.replace("grid=(B,)", "grid=(B, 1, 1)"))
    out = apply("split_state", p, np.random.default_rng(0))
    assert not isinstance(out, Refused), out.reason
    assert "tile(bid.z % cdiv(D, BV), BV)" in out.text() and "1 * cdiv(D, BV)" in out.text().splitlines()[0]
    _same_answer(p, out)


@pytest.mark.parametrize("prob, kernel, shapes", [k for k in KERNELS if k[1]])
def test_after_the_split_a_chunk_a_trip_ahead_and_registers_fit(prob, kernel, shapes, tmp_path):
    """split_state halves the state; with 32-row chunks (a retile) the prefetch's second set of chunk tiles fits in
    shared memory, which it does not unsplit; then registers: three structural tactics on one scan."""
    problem, p = _program(prob, kernel)
    assert "resources.smem" in " ".join(d.rule for d in verify(apply("prefetch", p, np.random.default_rng(0)),
                                                                 shapes=shapes) if d.is_error)
    q = apply("split_state", p, np.random.default_rng(0)).with_consts(BT=32)
    rmem = q.text().count("rmem(")
    for name in ("prefetch", "registers"):
        q = apply(name, q, np.random.default_rng(0))
        assert not isinstance(q, Refused), f"{name}: {q.reason}"
    assert "cp_async(" in q.text() and q.text().count("rmem(") > rmem
    _passes(q, problem, shapes, compile_in=tmp_path)
