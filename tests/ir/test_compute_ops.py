"""Interpreter semantics of the compute ops against numpy, tails and ties included."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.text import parse_program

HEAD = '@kernel(target="sm_90a", grid=(1,), threads=32)\n'


def _run(params: str, body: str, inputs: dict, outputs: dict, shape: dict | None = None):
    text = HEAD + f"def k({params}):\n" + "".join("    " + ln + "\n" for ln in body.strip().splitlines())
    outs = {k: np.full(v, np.nan, np.float32) if isinstance(v, tuple) else v for k, v in outputs.items()}
    interp.run(parse_program(text), shape or {}, inputs, outs)
    return outs


def test_ewise_broadcasts_rows_and_columns_and_scales():
    rng = np.random.default_rng(0)
    a, r, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8,), (4, 1)))
    out = _run("a: gmem[f32, (4, 8)], r: gmem[f32, (8,)], c: gmem[f32, (4, 1)], o: gmem[f32, (4, 8)], "
               "p: gmem[f32, (4, 8)]", """
t = rmem(f32, (4, 8))
rv = smem(f32, (8,))
cv = rmem(f32, (4, 1))
u = rmem(f32, (4, 8))
load(t, a[:, :])
load(rv, r[:])
load(cv, c[:, :])
ewise(u, rv, t, beta=2.0, fn="sub")
store(o[:, :], u)
ewise(u, t, cv, fn="max")
store(p[:, :], u)
""", {"a": a, "r": r, "c": c}, {"o": (4, 8), "p": (4, 8)})
    np.testing.assert_allclose(out["o"], r[None, :] - 2 * a, rtol=1e-6)
    np.testing.assert_allclose(out["p"], np.maximum(a, c), rtol=1e-6)


def test_reduce_scan_arg_along_both_axes():
    x = np.array([[3, 1, 2, 1], [0, 5, 5, -1]], np.float32)
    out = _run("x: gmem[f32, (2, 4)], s: gmem[f32, (2,)], m: gmem[f32, (1, 4)], c: gmem[f32, (2, 4)], "
               "v: gmem[f32, (2,)], i: gmem[i32, (2,)], j: gmem[i32, (4,)]", """
t = rmem(f32, (2, 4))
load(t, x[:, :])
rs = smem(f32, (2,))
reduce(rs, t)
store(s[:], rs)
rm = smem(f32, (1, 4))
reduce(rm, t, axis=0, fn="max")
store(m[:, :], rm)
sc = smem(f32, (2, 4))
scan(sc, t, axis=1, exclusive=True)
store(c[:, :], sc)
vv = smem(f32, (2,))
ii = smem(i32, (2,))
argmin(vv, ii, t)
store(v[:], vv)
store(i[:], ii)
jv = smem(f32, (4,))
jj = smem(i32, (4,))
argmax(jv, jj, t, axis=0)
store(j[:], jj)
""", {"x": x}, {k: s for k, s in (("s", (2,)), ("m", (1, 4)), ("c", (2, 4)), ("v", (2,)), ("i", (2,)),
                                  ("j", (4,)))})
    np.testing.assert_array_equal(out["s"], [7, 9])
    np.testing.assert_array_equal(out["m"], [[3, 5, 5, 1]])
    np.testing.assert_array_equal(out["c"], [[0, 3, 4, 6], [0, 0, 5, 10]])
    np.testing.assert_array_equal(out["v"], [1, -1])
    np.testing.assert_array_equal(out["i"], [1, 3])          # first of the tied minima
    np.testing.assert_array_equal(out["j"], [0, 1, 1, 0])


def test_argmin_update_respects_the_tail_limit_and_keeps_earlier_ties():
    scores = np.array([[5, 1, 1, -9], [2, 2, 7, 0]], np.float32)
    out = _run("s: gmem[f32, (2, 4)], a: gmem[i32, (2,)], b: gmem[f32, (2,)]", """
t = rmem(f32, (2, 4))
best = rmem(f32, (2,), fill=inf)
arg = rmem(i32, (2,), fill=-1.0)
load(t, s[:, :])
argmin_update(best, arg, t, base=0, limit=3)
argmin_update(best, arg, t, base=10, limit=12)
store(a[:], arg)
store(b[:], best)
""", {"s": scores}, {"a": (2,), "b": (2,)})
    # trip 1: columns 0..2 only (col 3 is past the limit); trip 2: columns 0..1 as 10, 11 (ties keep trip 1)
    np.testing.assert_array_equal(out["a"], [1, 0])
    np.testing.assert_array_equal(out["b"], [1, 2])


def test_topk_merge_keeps_the_k_smallest_sorted_with_index_ties():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 6, size=(3, 16)).astype(np.float32)       # many ties
    out = _run("s: gmem[f32, (3, 16)], o: gmem[i32, (3, 4)]", """
t = rmem(f32, (3, 16))
tv = rmem(f32, (3, 4), fill=inf)
ti = rmem(i32, (3, 4), fill=-1.0)
load(t, s[:, :])
topk_merge(tv, ti, t, base=0, limit=5)
topk_merge(tv, ti, t, base=5, limit=30)
store(o[:, :], ti)
""", {"s": s}, {"o": (3, 4)})
    cand_v = np.concatenate([s[:, :5], s], axis=1)
    cand_i = np.concatenate([np.arange(5), 5 + np.arange(16)])
    for r in range(3):
        order = np.lexsort((cand_i, cand_v[r]))[:4]
        np.testing.assert_array_equal(out["o"][r], cand_i[order])


def test_scatter_add_and_atomic_add_accumulate_and_skip_tails():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    ix = np.array([2, 0, 2, 9, 1, 1], np.int32)           # 9: outside the window, skipped under guard
    out = _run("x: gmem[f32, (N, 2)], ix: gmem[i32, (N,)], s: gmem[f32, (3, 2)], c: gmem[i32, (3,)], "
               "d: gmem[f32, (N, 2)]", """
t = rmem(f32, (8, 2))
j = rmem(i32, (8,))
one = rmem(i32, (8,), fill=1.0)
load(t, x[tile(0, 8), :])
load(j, ix[tile(0, 8)])
scatter_add(s[:, :], j, t, base=0, limit=5)
scatter_add(c[:], j, one, base=0, limit=N)
atomic_add(d[tile(0, 8), :], t)
atomic_add(d[tile(0, 8), :], t)
""", {"x": x, "ix": ix}, {"s": np.zeros((3, 2), np.float32), "c": np.zeros(3, np.float32),
                          "d": np.zeros((6, 2), np.float32)}, {"N": 6})
    np.testing.assert_array_equal(out["s"], [[2, 3], [8, 9], [0 + 4, 1 + 5]])     # row 5 is past limit=5
    np.testing.assert_array_equal(out["c"], [1, 2, 2])
    np.testing.assert_array_equal(out["d"], 2 * x)


def test_unguarded_scatter_out_of_window_faults_at_its_line():
    with pytest.raises(interp.InterpFault) as e:
        _run("ix: gmem[i32, (32,)], c: gmem[i32, (3,)]", """
j = rmem(i32, (32,))
one = rmem(i32, (32,), fill=1.0)
load(j, ix[:])
scatter_add(c[:], j, one, base=0, limit=32, guard=False)
""", {"ix": np.full(32, 7, np.int32)}, {"c": np.zeros(3, np.float32)})
    assert e.value.node.line == 6 and "outside" in e.value.message


def test_cast_unary_fill_transpose_round_to_the_destination_dtype():
    x = np.array([[1.7, -2.5, 3.14159265, 100.3]], np.float32)
    out = _run("x: gmem[f32, (1, 4)], i: gmem[i32, (1, 4)], b: gmem[f32, (1, 4)], q: gmem[f32, (1, 4)], "
               "t: gmem[f32, (4, 1)], f: gmem[f32, (4, 1)]", """
r = rmem(f32, (1, 4))
n = smem(i32, (1, 4))
h = smem(bf16, (1, 4))
u = smem(f32, (1, 4))
tt = smem(f32, (4, 1))
load(r, x[:, :])
cast(n, r)
cast(h, r)
unary(u, r, fn="square")
transpose(tt, r)
store(i[:, :], n)
store(b[:, :], h)
store(q[:, :], u)
store(t[:, :], tt)
fill(tt, value=-0.5)
store(f[:, :], tt)
""", {"x": x}, {"i": (1, 4), "b": (1, 4), "q": (1, 4), "t": (4, 1), "f": (4, 1)})
    np.testing.assert_array_equal(out["i"], [[1, -2, 3, 100]])                  # toward zero
    assert out["b"][0, 2] == np.float32(3.140625)                                # bf16 rounding
    np.testing.assert_allclose(out["q"], x * x, rtol=1e-6)
    np.testing.assert_array_equal(out["t"], x.T)
    np.testing.assert_array_equal(out["f"], np.full((4, 1), -0.5))
