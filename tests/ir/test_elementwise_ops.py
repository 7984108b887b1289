"""The activations of unary, ewise's compares, select and iota: interpreter semantics against numpy (large |x|
included), and the verifier rules that guard them (each a passing and a failing program)."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program

HEAD = '@kernel(target="sm_90a", grid=(1,), threads=32, consts={"R": 4, "C": 8})\n'


def _text(params: str, body: str) -> str:
    return HEAD + f"def k({params}):\n" + "".join("    " + ln + "\n" for ln in body.strip().splitlines())


def _run(params: str, body: str, inputs: dict, outputs: dict) -> dict:
    outs = {k: np.full(v, np.nan, np.float32) if isinstance(v, tuple) else v for k, v in outputs.items()}
    interp.run(parse_program(_text(params, body)), {}, inputs, outs)
    return outs


def _rules(params: str, body: str) -> list[str]:
    return [d.rule for d in check_text(_text(params, body))]


# ------------------------------------------------------------------ unary activations

X = np.array([-1000, -100, -88.5, -30, -5, -1, -1e-3, 0, 1e-3, 1, 5, 30, 88.5, 100, 1000, 3.25],
             np.float32).reshape(2, 8)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


REFS = {"sigmoid": _sigmoid64, "silu": lambda x: x * _sigmoid64(x), "softplus": lambda x: np.logaddexp(0, x),
        "exp2": np.exp2}


@pytest.mark.parametrize("fn", sorted(REFS))
def test_activations_match_numpy_at_large_magnitudes(fn):
    body = f'''
t = smem(f32, (2, 8))
u = smem(f32, (2, 8))
load(t, x[:, :])
sync()
unary(u, t, fn="{fn}")
sync()
store(o[:, :], u)
'''
    params = "x: gmem[f32, (2, 8)], o: gmem[f32, (2, 8)]"
    assert _rules(params, body) == []
    with np.errstate(over="ignore"):
        want = REFS[fn](X.astype(np.float64)).astype(np.float32)
    got = _run(params, body, {"x": X}, {"o": (2, 8)})["o"]
    assert np.all(np.isfinite(got[np.isfinite(want)])), got          # softplus and sigmoid never overflow
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-37)


def test_softplus_is_exact_where_the_naive_formula_overflows_or_underflows():
    body = 't = smem(f32, (2, 8))\nload(t, x[:, :])\nunary(t, t, fn="softplus")\nstore(o[:, :], t)'
    got = _run("x: gmem[f32, (2, 8)], o: gmem[f32, (2, 8)]", body, {"x": X}, {"o": (2, 8)})["o"].reshape(-1)
    assert got[14] == 1000 and got[13] == 100 and got[0] == 0      # log(1 + e^1000) = 1000, not inf
    assert 0 < got[3] < 1e-12                                        # log1p keeps e^-30


def test_an_activation_into_an_integer_tile_is_refused():
    body = ('t = smem(i32, (2, 8))\nu = smem(i32, (2, 8))\nload(t, x[:, :])\nunary(u, t, fn="sigmoid")\n'
            'store(o[:, :], u)')
    assert "compute.dtype" in _rules("x: gmem[i32, (2, 8)], o: gmem[i32, (2, 8)]", body)


# ------------------------------------------------------------------ compares and select

A = np.array([[0.5, -1, 2, np.nan, 3, 3, -0.0, 7]], np.float32).repeat(4, 0)
B = np.array([[0.2, -1, 5, 1, np.nan, 3, 0.0, -7]], np.float32).repeat(4, 0)
CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
       "ne": np.not_equal}
P = "a: gmem[f32, (R, C)], b: gmem[f32, (R, C)], o: gmem[f32, (R, C)], m: gmem[i32, (R, C)]"


@pytest.mark.parametrize("fn", sorted(CMP))
def test_compares_write_one_or_zero_in_any_destination_dtype(fn):
    body = f'''
x = smem(f32, (R, C))
y = smem(f32, (R, C))
f = smem(f32, (R, C))
i = smem(i32, (R, C))
z = smem(bool, (R, C))
load(x, a[:, :])
load(y, b[:, :])
sync()
ewise(f, x, y, fn="{fn}")
ewise(z, x, y, fn="{fn}")
ewise(i, z, z, fn="add")
sync()
store(o[:, :], f)
store(m[:, :], i)
'''
    assert _rules(P, body) == []            # a compare into i32 or bool is not an implicit narrowing
    out = _run(P, body, {"a": A, "b": B}, {"o": (4, 8), "m": np.zeros((4, 8), np.int32)})
    want = CMP[fn](A, B)
    np.testing.assert_array_equal(out["o"], want.astype(np.float32))
    np.testing.assert_array_equal(out["m"], 2 * want.astype(np.int32))


def test_a_float_compare_into_an_integer_mask_compares_the_floats():
    body = ('x = smem(f32, (R, C))\ny = smem(f32, (R, C))\ni = smem(i32, (R, C))\nload(x, a[:, :])\n'
            'load(y, b[:, :])\newise(i, x, y, fn="gt", beta=0.5)\nstore(m[:, :], i)')
    out = _run(P, body, {"a": A, "b": B}, {"o": (4, 8), "m": np.zeros((4, 8), np.int32)})
    assert out["m"][0, 0] == 1            # 0.5 > 0.1: truncated to integers first it would be 0 > 0
    np.testing.assert_array_equal(out["m"], np.greater(A, 0.5 * B).astype(np.int32))


def test_an_integer_compare_takes_whole_scales_and_arithmetic_into_an_integer_tile_still_narrows():
    ints = 'i = smem(i32, (R, C))\nj = smem(i32, (R, C))\nfill(j, value=1.0)\nsync()\n'
    assert "compute.dtype" in _rules(P, ints + 'ewise(i, j, j, fn="lt", alpha=0.5)\nstore(m[:, :], i)')
    assert "compute.dtype" not in _rules(P, ints + 'ewise(i, j, j, fn="lt", alpha=2.0)\nstore(m[:, :], i)')
    floats = 'x = smem(f32, (R, C))\ni = smem(i32, (R, C))\nload(x, a[:, :])\n'
    assert "types.narrowing" in _rules(P, floats + 'ewise(i, x, x, fn="add")\nstore(m[:, :], i)')
    assert "types.narrowing" not in _rules(P, floats + 'ewise(i, x, x, fn="le")\nstore(m[:, :], i)')


SELECT = '''
x = smem(f32, (R, C))
y = smem(f32, (R, C))
v = smem(f32, (C,))
c = smem(i32, (R, C))
f = smem(f32, (R, C))
load(x, a[:, :])
load(y, b[:, :])
load(v, a[1, :])
sync()
ewise(c, x, y, fn="gt")
select(f, c, x, v)
sync()
store(o[:, :], f)
sync()
select(f, x, x, y)
sync()
store(p[:, :], f)
'''
PS = P + ", p: gmem[f32, (R, C)]"


def test_select_takes_a_where_cond_is_nonzero_and_broadcasts():
    assert _rules(PS, SELECT) == []
    out = _run(PS, SELECT, {"a": A, "b": B}, {"o": (4, 8), "p": (4, 8), "m": np.zeros((4, 8), np.int32)})
    np.testing.assert_array_equal(out["o"], np.where(A > B, A, A[1][None, :]))
    # a float condition: nonzero (NaN included) is true, -0.0 is false
    np.testing.assert_array_equal(out["p"], np.where(A != 0, A, B))


def test_select_with_a_condition_that_does_not_broadcast_is_refused():
    body = SELECT.replace("c = smem(i32, (R, C))", "c = smem(i32, (R, C))\nd = smem(i32, (R, 2))").replace(
        "select(f, c, x, v)", "select(f, d, x, v)")
    assert "compute.broadcast" in _rules(PS, body)


# ------------------------------------------------------------------ iota and masks

MASK = '''
row = smem(i32, (R, C))
col = smem(i32, (R, C))
mask = smem(i32, (R, C))
iota(row, base=bid.x * R + 3, axis=0)
iota(col, base=0, axis=-1)
ewise(mask, row, col, fn="ge")
sync()
store(m[:, :], mask)
v = smem(f32, (C,))
iota(v, base=-2, axis=0)
sync()
store(o[0, :], v)
'''


def test_iota_with_a_compare_gives_a_causal_mask():
    params = "o: gmem[f32, (R, C)], m: gmem[i32, (R, C)]"
    assert _rules(params, MASK) == []
    out = _run(params, MASK, {}, {"o": (4, 8), "m": np.zeros((4, 8), np.int32)})
    rows, cols = np.meshgrid(np.arange(4) + 3, np.arange(8), indexing="ij")
    np.testing.assert_array_equal(out["m"], (rows >= cols).astype(np.int32))
    np.testing.assert_array_equal(out["o"][0], np.arange(8) - 2)


def test_iota_along_an_axis_its_tile_lacks_is_refused():
    body = MASK.replace("iota(v, base=-2, axis=0)", "iota(v, base=-2, axis=1)")
    assert "compute.axis" in _rules("o: gmem[f32, (R, C)], m: gmem[i32, (R, C)]", body)


def test_iota_and_select_round_trip_through_the_text():
    text = _text(PS, SELECT + MASK.replace("store(o[0, :], v)", ""))
    prog = parse_program(text)
    assert parse_program(prog.text()) == prog
    assert "iota(row, base=bid.x * R + 3, axis=0)" in prog.text() and "select(f, c, x, v)" in prog.text()
