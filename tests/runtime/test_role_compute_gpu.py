"""Elementwise compute ops on the GPU against the interpreter, outside roles (CTA-spread rmem and smem tiles),
inside a role (smem tiles split over the role's threads), on a role's wgmma accumulator (its fragments) and on
the other fragments and row vectors a role holds (row reductions across each row's quad), on random inputs and
ragged shapes (marked `gpu`: run on the GPU machine).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_role_compute_gpu.py -q -p no:cacheprovider -o addopts=""

The CPU gate cannot see an op lowered over the wrong threads (the interpreter computes whole tiles): these
launch each lowered kernel directly and compare every output element with the interpreter's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.expr import evaluate
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program
from cake_core.ir.types import DType
from cake_core.lower import compile_kernel, lower

pytestmark = pytest.mark.gpu

INT_SENTINEL = -0x7FFFFFFF
UNARY = ("neg", "abs", "square", "sqrt", "rsqrt", "exp", "log", "exp2", "sigmoid", "silu", "softplus")
ARITH = ("add", "sub", "mul", "div", "max", "min")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


# ------------------------------------------------------------------ launching, and the interpreter's answer

def _launch(text: str, shape: dict, inputs: dict[str, np.ndarray], tmp_path: Path,
            fetch: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Lower, compile and launch ``text`` once on ``inputs``; every output poisoned first (NaN, a sentinel); the
    outputs, and the inputs named in ``fetch`` (an accumulator uploaded zeroed), come back."""
    cp = pytest.importorskip("cupy")
    from cake_core.runtime import gpu
    from cake_core.runtime.tma import encode_tensor_maps
    if gpu.gpu_model() is None:
        pytest.skip("no usable NVIDIA GPU here")
    lr = lower(parse_program(text, "k.cake"), "k.cake")
    assert lr.ok, [d.format("k.cake", text) for d in lr.diagnostics]
    lk = lr.value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    fn = cp.RawModule(path=str(cr.value.cubin_path)).get_function(lk.kernel_name)
    if lk.smem_bytes > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = lk.smem_bytes
    env = {**dict(lk.consts), **shape}
    dev = {}
    for a in lk.params:
        if a.name in inputs:
            dev[a.name] = gpu._to_device(cp, inputs[a.name], a.dtype)
        else:
            dev[a.name] = gpu._alloc(cp, tuple(int(evaluate(d, env)) for d in a.shape), a.dtype)
            gpu._poison(dev[a.name], a.dtype)
    args = tuple(dev[a.name] for a in lk.params) + tuple(np.int32(shape[d]) for d in lk.dims)
    args += tuple(encode_tensor_maps(lk, dev, shape))
    fn(lk.grid_for(shape), (lk.threads, 1, 1), args, shared_mem=lk.smem_bytes)
    cp.cuda.runtime.deviceSynchronize()
    return {a.name: gpu._to_host(dev[a.name], a.dtype) for a in lk.params if a.name not in inputs or a.name in fetch}


def _interpret(text: str, shape: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    prog = parse_program(text, "k.cake")
    env = {**prog.const_env, **shape}
    outs = {}
    for p in prog.params:
        if p.name in inputs:
            continue
        dims = tuple(int(evaluate(d, env)) for d in p.type.shape)
        outs[p.name] = np.full(dims, INT_SENTINEL, np.int32) if p.type.dtype is DType.I32 else \
            np.full(dims, np.nan, np.float32)
    return interp.run(prog, shape, inputs, outs)


def _agree(text: str, shape: dict, inputs: dict[str, np.ndarray], tmp_path: Path, atol: float = 1e-4) -> None:
    got, want = _launch(text, shape, inputs, tmp_path), _interpret(text, shape, inputs)
    for name, w in want.items():
        g = got[name].reshape(w.shape)
        if w.dtype.kind == "i":
            bad = np.argwhere(g != w)
            assert not bad.size, f"{name}: {len(bad)} elements differ, first at {tuple(bad[0])}: gpu " \
                                 f"{g[tuple(bad[0])]}, interpreter {w[tuple(bad[0])]}"
        else:
            # atol: nvcc fuses a * b + c into one rounding (an FMA) where numpy rounds twice, so a near-cancellation
            # of operands of size ~100 differs by ~1e-7 absolute; an element of the wrong thread differs by ~1
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol, equal_nan=True, err_msg=name)


# ------------------------------------------------------------------ tile programs: CTA, smem in a role

SHAPE = {"M": 50, "N": 45}        # ragged against both tile shapes


def _inputs(shape: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    m, n = shape["M"], shape["N"]
    x = (rng.standard_normal((m, n)) * 30).astype(np.float32)          # large |x|: the activations' tails
    y = np.where(rng.random((m, n)) < 0.3, x, rng.standard_normal((m, n)) * 4).astype(np.float32)   # ties
    return {"x": x, "y": y, "v": rng.standard_normal(n).astype(np.float32),
            "j": rng.integers(-1000, 1000, (m, n)).astype(np.int32),
            "h": bf16_round(rng.standard_normal((m, n)).astype(np.float32))}


# (destination dtype, statement over {d} the destination and {x} {y} {v} {j} {h} the sources)
CASES: dict[str, list[tuple[str, str]]] = {
    "unary": [("f32", f'unary({{d}}, {{x}}, fn="{f}")') for f in UNARY]
             + [("i32", f'unary({{d}}, {{j}}, fn="{f}")') for f in ("neg", "abs", "square")],
    "ewise": [("f32", f'ewise({{d}}, {{x}}, {{y}}, fn="{f}", alpha=1.5)') for f in ARITH + COMPARE]
             + [("f32", f'ewise({{d}}, {{v}}, {{x}}, fn="{f}")') for f in ARITH + COMPARE]
             + [("i32", f'ewise({{d}}, {{x}}, {{y}}, fn="{f}", beta=0.5)') for f in COMPARE]
             + [("i32", f'ewise({{d}}, {{j}}, {{j}}, fn="{f}", beta=-3.0)') for f in ("add", "sub", "mul", "max")],
    "misc": [("f32", "fill({d}, value=-inf)"), ("i32", "fill({d}, value=7.0)"), ("f32", "cast({d}, {h})"),
             ("i32", "cast({d}, {x})"), ("bf16", "cast({d}, {x})"), ("f32", "select({d}, {j}, {x}, {v})"),
             ("f32", "select({d}, {y}, {x}, {v})"), ("i32", "iota({d}, base=bid.y * BM - 5, axis=0)"),
             ("f32", "iota({d}, base=bid.x * BN, axis=1)")],
}


def tile_program(where: str, stmts: list[tuple[str, str]]) -> str:
    """A kernel that loads x, y, v, j, h, runs ``stmts`` each into its own destination tile, and stores them:
    ``where`` is "smem" (smem tiles, every thread), "rmem" (CTA-spread rmem tiles) or "role" (smem tiles, a role
    of warps 1..3 of 4: 64 threads from thread 32)."""
    bm, bn = (32, 24) if where == "rmem" else (24, 20)       # rmem tiles split evenly over the 128 threads
    outs = {t: [i for i, (dt, _) in enumerate(stmts) if dt == t] for t in ("f32", "i32", "bf16")}
    gname = {"f32": "o", "i32": "m", "bf16": "hb"}
    params = ["x: gmem[f32, (M, N)]", "y: gmem[f32, (M, N)]", "v: gmem[f32, (N,)]", "j: gmem[i32, (M, N)]",
              "h: gmem[bf16, (M, N)]"] + [f"{gname[t]}: gmem[{t}, ({len(ix)}, M, N)]" for t, ix in outs.items() if ix]
    win = "tile(bid.y, BM), tile(bid.x, BN)"
    space = "rmem" if where == "rmem" else "smem"
    src = {k: f"{k}_t" for k in "xyjh"} | {"v": "v_s"}
    body = [f"{k}_t = {space}({dt}, (BM, BN))" for k, dt in (("x", "f32"), ("y", "f32"), ("j", "i32"), ("h", "bf16"))]
    body += ["v_s = smem(f32, (BN,))"] + [f"d{i} = {space}({dt}, (BM, BN))" for i, (dt, _) in enumerate(stmts)]
    body += [f"load({k}_t, {k}[{win}])" for k in "xyjh"] + ["load(v_s, v[tile(bid.x, BN)])"]
    # shared memory keeps what the previous kernel left there: an element an op skips would still hold the
    # right value if the last launch computed the same tiles, so every destination starts from a sentinel
    body += [f"fill(d{i}, value=-12345.0)" for i in range(len(stmts))] + ["sync()"]
    ops = [s.format(d=f"d{i}", **src) for i, (_, s) in enumerate(stmts)]
    body += ['with role("math", warps=(1, 3)):'] + ["    " + o for o in ops] if where == "role" else ops
    body += ["sync()"] + [f"store({gname[dt]}[{outs[dt].index(i)}, {win}], d{i})" for i, (dt, _) in enumerate(stmts)]
    return (f'@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=128, consts={{"BM": {bm}, "BN": '
            f'{bn}}})\ndef k({", ".join(params)}):\n' + "".join(f"    {ln}\n" for ln in body))


@pytest.mark.parametrize("where", ["smem", "rmem", "role"])
@pytest.mark.parametrize("group", sorted(CASES))
def test_elementwise_ops_match_the_interpreter(group, where, tmp_path):
    seed = len(group) + 10 * ("smem", "rmem", "role").index(where)        # no two launches on the same inputs
    _agree(tile_program(where, CASES[group]), SHAPE, _inputs(SHAPE, seed), tmp_path)


# ------------------------------------------------------------------ a role's wgmma accumulator

WS = (Path(__file__).resolve().parents[2] / "cake_core" / "problems" / "gemm_bf16" / "kernels" /
      "gemm_bf16_ws.cake").read_text()
GEMM = {"M": 200, "N": 136, "K": 72}     # ragged M and N tiles; K, N multiples of 8 (TMA's 16-byte rows)


def acc_program(stmts: str, after_acc: str = "") -> str:
    """The warp-specialised gemm (producer warps 0..4, consumer warps 4..12) with ``stmts`` on its accumulator
    before the store; x_s (BM, BN), v_s (BN,), k_s (BM, BN) i32 (a causal mask: row >= col) are made before the
    roles (the mask from a row and a column of indices), o_s (BM, BN) is stored after them."""
    text = WS.replace("c: gmem[f32, (M, N)])", "c: gmem[f32, (M, N)], x: gmem[f32, (M, N)], v: gmem[f32, (N,)], "
                                              "o: gmem[f32, (M, N)])")
    text = text.replace("    full = mbarrier(S)\n", (
        "    x_s = smem(f32, (BM, BN))\n    v_s = smem(f32, (BN,))\n    o_s = smem(f32, (BM, BN))\n"
        "    r_s = smem(i32, (BM, 1))\n    c_s = smem(i32, (BN,))\n    k_s = smem(i32, (BM, BN))\n"
        "    full = mbarrier(S)\n"
        "    load(x_s, x[tile(bid.y, BM), tile(bid.x, BN)])\n    load(v_s, v[tile(bid.x, BN)])\n"
        "    fill(o_s, value=0.0)\n    iota(r_s, base=bid.y * BM, axis=0)\n    iota(c_s, base=bid.x * BN, axis=0)\n"
        "    sync()\n    ewise(k_s, r_s, c_s, fn=\"ge\")\n    sync()\n"))
    text = text.replace("        acc = rmem(f32, (BM, BN))\n", "        acc = rmem(f32, (BM, BN))\n" + after_acc)
    planted = "".join(f"        {s}\n" for s in stmts.strip().splitlines())
    text = text.replace("        store(c[", planted + "        store(c[")
    return text + "    sync()\n    store(o[tile(bid.y, BM), tile(bid.x, BN)], o_s)\n"


ACC_CASES = {f"unary {f}": f'unary(acc, acc, fn="{f}")' for f in UNARY} | {
    "ewise chain": 'ewise(acc, acc, x_s, fn="mul", alpha=0.5)\newise(acc, v_s, acc, fn="sub")\n'
                   'ewise(acc, acc, x_s, fn="max")\newise(acc, acc, x_s, fn="div", beta=2.0)',
    "compare": 'ewise(acc, acc, v_s, fn="ge")',
    "iota rows": "iota(acc, base=bid.y * BM, axis=0)",
    "iota cols": "iota(acc, base=bid.x * BN, axis=1)",
    "causal mask": "select(acc, k_s, acc, v_s)",
    "to smem": 'cast(o_s, acc)\newise(o_s, o_s, acc, fn="sub", alpha=3.0)\nfill(acc, value=2.5)',
}


def _gemm_inputs(seed: int) -> dict[str, np.ndarray]:
    # small integers: a @ b is exact in f32 whatever the order of the sums, so compares of the accumulator agree
    rng = np.random.default_rng(seed)
    m, n, k = GEMM["M"], GEMM["N"], GEMM["K"]
    return {"a": rng.integers(-2, 3, (m, k)).astype(np.float32), "b": rng.integers(-2, 3, (k, n)).astype(np.float32),
            "x": (rng.standard_normal((m, n)) * 3 + 0.25).astype(np.float32),
            "v": (rng.standard_normal(n) * 5 + 0.5).astype(np.float32)}


@pytest.mark.parametrize("case", sorted(ACC_CASES))
def test_ops_on_a_wgmma_accumulator_inside_a_role_match_the_interpreter(case, tmp_path):
    _agree(acc_program(ACC_CASES[case]), GEMM, _gemm_inputs(seed=3), tmp_path)


# fragments and row vectors the consumers hold (ir.fragments): a bf16 and an i32 fragment of the accumulator's
# shape, two (BM, 1) row vectors; the row reductions cross each row's quad
FRAGMENTS = ("        mx = rmem(f32, (BM, 1))\n        sm = rmem(f32, (BM, 1), fill=2.0)\n"
             "        fb = rmem(bf16, (BM, BN))\n        fi = rmem(i32, (BM, BN))\n")
FRAGMENT_CASES = {
    "row softmax": 'reduce(mx, acc, axis=1, fn="max")\newise(acc, acc, mx, fn="sub")\nunary(acc, acc, fn="exp")\n'
                   'reduce(sm, acc, axis=1)\newise(acc, acc, sm, fn="div")',
    "row min and row vector math": 'reduce(mx, acc, axis=1, fn="min")\newise(mx, mx, sm, fn="mul")\n'
                                   'unary(mx, mx, fn="neg")\newise(acc, acc, mx, fn="add")',
    "bf16 fragment": "cast(fb, acc)\nunary(acc, acc, fn=\"neg\")\ncast(acc, fb)",
    "i32 fragment mask": 'iota(fi, base=bid.x * BN, axis=1)\newise(fi, fi, v_s, fn="lt")\n'
                         'reduce(mx, acc, axis=1, fn="max")\nselect(acc, fi, acc, mx)',
}


@pytest.mark.parametrize("case", sorted(FRAGMENT_CASES))
def test_ops_on_fragments_and_row_vectors_inside_a_role_match_the_interpreter(case, tmp_path):
    _agree(acc_program(FRAGMENT_CASES[case], after_acc=FRAGMENTS), GEMM, _gemm_inputs(seed=5), tmp_path)


def stores_program() -> str:
    """Row sums and a bf16 copy of the accumulator stored from the consumers: a row vector (the first lane of each
    row's quad writes it) and a 16-bit fragment (the accumulator's store, converting)."""
    text = acc_program('reduce(mx, acc, axis=1)\ncast(fb, acc)\nstore(rv[tile(bid.y, BM), tile(0, 1)], mx)\n'
                       'store(hb[tile(bid.y, BM), tile(bid.x, BN)], fb)', after_acc=FRAGMENTS)
    return text.replace("o: gmem[f32, (M, N)])", "o: gmem[f32, (M, N)], rv: gmem[f32, (M, 1)], hb: gmem[bf16, (M, N)])")


def test_a_row_vector_and_a_bf16_fragment_are_stored_from_the_role(tmp_path):
    # every CTA of a row of tiles writes its own rows' sums over its own columns: one column of tiles (N = BN)
    shape = {"M": GEMM["M"], "N": 64, "K": GEMM["K"]}
    x = _gemm_inputs(seed=6)
    x = {"a": x["a"], "b": x["b"][:, :64], "x": x["x"][:, :64], "v": x["v"][:64]}
    _agree(stores_program(), shape, x, tmp_path)


def test_a_fill_before_the_first_wgmma_is_accumulated_onto(tmp_path):
    # acc = rmem(...) is zeroed lazily (the first wgmma drops its old value): a fill before it must survive
    _agree(acc_program("", after_acc="        fill(acc, value=1.0)\n"), GEMM, _gemm_inputs(seed=4), tmp_path)
