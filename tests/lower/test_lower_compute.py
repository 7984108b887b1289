"""Lowering the compute ops: every op lowers and compiles, scratch is staged and reused, limits are
reported at their IR line."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
from test_compute_rules import OPS  # noqa: E402  (the program that uses every compute op)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_every_compute_op_lowers():
    r = lower(parse_program(OPS, "ops.cake"), "ops.cake")
    assert r.outcome is Outcome.OK, [d.format("ops.cake") for d in r.diagnostics]
    src = r.value.source
    for call in ("cake::reduce_smem<128, 64, 64, 1, 1, THREADS>", "cake::scan_smem<128, 64, 64, 1, 0, false, THREADS>",
                 "cake::argreduce_smem<128, 64, 64, 1, false, THREADS>", "cake::argmin_update_smem<128, 64, THREADS>",
                 "cake::topk_merge_smem<128, 64, 4, THREADS>", "cake::stage_smem_rmem<8192, THREADS>",
                 "cake::unstage_rmem_smem<128, THREADS>(col, cake_st_col)", "cake::atomic_add_gmem(", "expf(",
                 "int* __restrict__ cnt"):
        assert call in src, call
    # broadcast of an rmem column vector goes through scratch; (r, c) -> r
    assert "cake_st_col[cake_r]" in src
    # scratch is one region reused by consecutive statements: every staging offset lies in it
    offsets = {int(m) for m in re.findall(r"cake_smem \+ (\d+)\);\n", src)}
    assert min(offsets) == 32768 and r.value.smem_bytes <= 32768 + 2 * 32768


def test_scratch_moves_past_a_later_smem_tile():
    text = OPS.replace('    fill(v, value=1.0)\n', '    late = smem(f32, (64,))\n    reduce(v, a, fn="min")\n')
    r = lower(parse_program(text, "ops.cake"), "ops.cake")
    assert r.ok, r.diagnostics
    src = r.value.source
    late = int(re.search(r"late = reinterpret_cast<float\*>\(cake_smem \+ (\d+)\)", src).group(1))
    tail = src[src.index("late = "):]
    after = [int(m) for m in re.findall(r"cake_st_\w+ = reinterpret_cast<\w+\*>\(cake_smem \+ (\d+)\)", tail)]
    assert after and min(after) >= late + 64 * 4


def test_lowering_limits_are_reported_at_their_line():
    text = OPS.replace("    fill(v, value=1.0)\n", "    w = rmem(f32, (4, 4, 8))\n    fill(w)\n")
    r = lower(parse_program(text, "ops.cake"), "ops.cake")
    assert r.outcome is Outcome.COMPILE_FAILED
    (d,) = r.errors
    assert d.rule == "lower.unsupported_rank" and d.line == _line_of(text, "fill(w)")


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_every_compute_op_compiles_without_warnings(tmp_path):
    r = lower(parse_program(OPS, "ops.cake"), "ops.cake")
    c = compile_kernel(r.value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert "warning" not in c.artifacts["nvcc.log"].lower(), c.artifacts["nvcc.log"]


DIFF = '''@kernel(target="sm_90a", grid=(cdiv(N, 128),), threads=128, consts={"BC": 64})
def diff(x: gmem[f32, (N, C)], o_exp: gmem[f32, (N, C)], o_scan: gmem[f32, (N, C)], o_am: gmem[i32, (N,)], o_ax: gmem[f32, (N,)], o_cast: gmem[i32, (N, C)], o_acc: gmem[f32, (N, C)], o_red: gmem[f32, (N,)]):
    a = rmem(f32, (128, BC))
    t = rmem(f32, (128, BC))
    v = rmem(f32, (128,))
    i = rmem(i32, (128,))
    n = rmem(i32, (128, BC))
    s = smem(f32, (BC, 128))
    load(a, x[tile(bid.x, 128), tile(0, BC)])
    unary(t, a, fn="exp")
    store(o_exp[tile(bid.x, 128), tile(0, BC)], t)
    scan(t, a, axis=1, fn="max", exclusive=True)
    ewise(t, t, a, fn="max")
    store(o_scan[tile(bid.x, 128), tile(0, BC)], t)
    argmin(v, i, a, axis=1)
    store(o_am[tile(bid.x, 128)], i)
    argmax(v, i, a, axis=1)
    store(o_ax[tile(bid.x, 128)], v)
    cast(n, a)
    store(o_cast[tile(bid.x, 128), tile(0, BC)], n)
    atomic_add(o_acc[tile(bid.x, 128), tile(0, BC)], a)
    atomic_add(o_acc[tile(bid.x, 128), tile(0, BC)], t)
    transpose(s, a)
    reduce(v, s, axis=0, fn="sum")
    store(o_red[tile(bid.x, 128)], v)
'''


@pytest.mark.gpu
def test_compute_ops_on_the_gpu_match_the_interpreter(tmp_path, monkeypatch):
    """Differential: the lowered ops against the interpreter, through the GPU gate."""
    import numpy as np
    cp = pytest.importorskip("cupy")

    from cake_core.ir import interp
    from cake_core.problems.base import Problem, data, output
    from cake_core.runtime import gpu
    if gpu.gpu_model() is None:
        pytest.skip("no usable NVIDIA GPU here")
    prog = parse_program(DIFF, "diff.cake")
    outs = tuple(p.name for p in prog.params[1:])

    def oracle(x):   # the gate draws the inputs on the device: the interpreter runs on a host copy
        dev = x["x"]
        host = cp.asnumpy(dev)
        shape = {"N": host.shape[0], "C": host.shape[1]}
        o = {p.name: np.zeros(tuple(int(d if isinstance(d, int) else shape[d.name]) for d in p.type.shape),
                              np.float32) for p in prog.params[1:]}
        got = interp.run(prog, shape, {"x": host}, o)
        return {k: cp.asarray(v) if isinstance(dev, cp.ndarray) else v for k, v in got.items()}

    prob = Problem("diff", "differential", ("N", "C"), (data("x", "f32"), *(output(n, "f32") for n in outs)),
                   lambda s, rng: {"x": (3 * rng.normal((s["N"], s["C"]))).astype(np.float32)},
                   oracle, 1e-5, lambda s: 1.0, lambda s: 1.0, "", zeroed_outputs=("o_acc",))
    monkeypatch.setattr(gpu, "_poison", lambda buf, dtype: buf.fill(0))
    lr = lower(prog, "diff.cake")
    c = compile_kernel(lr.value, cache_dir=tmp_path)
    runs = gpu.check_and_time(c.value, lr.value, prob, [{"N": 300, "C": 50}, {"N": 128, "C": 64}], seed=2,
                              time=False)
    assert all(r.correct for r in runs), [(r.shape, r.message) for r in runs]
