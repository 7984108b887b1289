"""The chained-GEMM recognizer (``agents.chained``) and ``warp_specialize`` on what it recognises: the naive mha
seed (softmax attention: a running max, row sums, a key mask) and a second chained seed written here (o =
relu(q k^T) v, no row state, keys and values of their own lengths and widths). Each becomes a TMA producer and
wgmma consumers whose epilogue runs on the tiles the role holds, with the probabilities as the second wgmma's
register A; the child verifies, computes what its parent computes (the oracle for mha, the interpreter against
the parent for the second), lowers and compiles. The structural tactics that take the warp-specialised form
from there apply too, and what is not a chained mainloop is refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.agents.chained import find_chained
from cake_core.agents.rewrite import Refused, count_ops
from cake_core.agents.tactics import apply
from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.expr import evaluate
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower import compile as compile_mod
from cake_core.lower import compile_kernel, lower
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

MHA = get_problem("mha")

RELU = """@kernel(target="sm_90a", grid=(cdiv(T, BM), H), threads=128, consts={"BM": 32, "BN": 32, "D": 64, "E": 64})
def relu_attention(q: gmem[bf16, (H, T, DK)], k: gmem[bf16, (H, L, DK)], v: gmem[bf16, (H, L, DV)], o: gmem[f32, (H, T, DV)]):
    q_s = smem(bf16, (BM, D))
    k_s = smem(bf16, (BN, D))
    kt_s = smem(bf16, (D, BN))
    v_s = smem(bf16, (BN, E))
    p_s = smem(bf16, (BM, BN))
    s = rmem(f32, (BM, BN))
    acc = rmem(f32, (BM, E))
    load(q_s, q[bid.y, tile(bid.x, BM), tile(0, D)])
    fill(acc)
    sync()
    for j in range(cdiv(L, BN)):
        load(k_s, k[bid.y, tile(j, BN), tile(0, D)])
        load(v_s, v[bid.y, tile(j, BN), tile(0, E)])
        sync()
        transpose(kt_s, k_s)
        sync()
        fill(s)
        mma(s, q_s, kt_s)
        ewise(s, s, s, fn="max", beta=0.0)
        cast(p_s, s)
        sync()
        mma(acc, p_s, v_s)
        sync()
    store(o[bid.y, tile(bid.x, BM), tile(0, E)], acc)
"""
RELU_SHAPES = [{"H": 2, "T": 70, "L": 100, "DK": 48, "DV": 40}, {"H": 1, "T": 128, "L": 64, "DK": 64, "DV": 64},
               {"H": 1, "T": 3, "L": 130, "DK": 16, "DV": 56}]


def _ws(text: str, seed: int = 0):
    out = apply("warp_specialize", parse_program(text, "seed.cake"), np.random.default_rng(seed), None)
    assert not isinstance(out, Refused), out.reason
    return out


def _run(prog, shape: dict, inputs: dict) -> np.ndarray:
    env = {**prog.const_env, **shape}
    o = next(p for p in prog.params if p.name == "o")
    outs = {"o": np.full(tuple(int(evaluate(d, env)) for d in o.type.shape), np.nan, np.float32)}
    return interp.run(prog, shape, dict(inputs), outs)["o"]


def test_both_seeds_are_recognised():
    m = find_chained(parse_program(MHA.seed_text(), "mha.cake"))
    assert (m.a1[0], m.b1[0], m.b1[2], m.b2[0], m.a2) == ("q_s", "k_s", "kt_s", "v_s", "p_s")
    assert (m.rows, m.keys, m.red, m.cols) == ("BM", "BN", "D", "D")
    r = find_chained(parse_program(RELU, "relu.cake"))
    assert (r.first.arg("acc"), r.second.arg("acc"), r.cols, r.red) == ("s", "acc", "E", "D")


def test_the_mha_seed_becomes_a_warp_specialised_kernel_that_passes_the_gate():
    out = _ws(MHA.seed_text())
    ops = count_ops(out.body)
    assert ops.get("role") == 2 and ops.get("wgmma") == 3 and ops.get("tma_load") == 5 and not ops.get("mma")
    assert "wgmma(acc, p_s, v_s[j % S])" in out.text() and "p_s = rmem(bf16, (BM, BN))" in out.text()
    assert "m_i = rmem(f32, (BM, 1), fill=-inf)" in out.text() and "sync()" not in out.text().split("with role")[1]
    assert check_text(out.text(), "ws.cake") == []
    small = MHA.shape_set("mha_small")
    result = check_stage(parse_program(out.text(), "ws.cake"), MHA, list(small.shapes), seed=3)
    assert all(v.correct for v in result.value), [(v.shape, v.message) for v in result.value]


@pytest.mark.parametrize("shape", RELU_SHAPES, ids=lambda s: "T{T}_L{L}_DK{DK}_DV{DV}".format(**s))
def test_the_second_seed_computes_what_its_parent_computes(shape):
    seed = parse_program(RELU, "relu.cake")
    out = _ws(RELU)
    assert not [d for d in verify(out, shapes=RELU_SHAPES) if d.is_error], \
        [d.message for d in verify(out, shapes=RELU_SHAPES)]
    rng = np.random.default_rng(shape["T"] + shape["L"])
    H, T, L, DK, DV = (shape[d] for d in ("H", "T", "L", "DK", "DV"))
    inputs = {"q": bf16_round(rng.normal(size=(H, T, DK)).astype(np.float32) / 4),
              "k": bf16_round(rng.normal(size=(H, L, DK)).astype(np.float32)),
              "v": bf16_round(rng.normal(size=(H, L, DV)).astype(np.float32))}
    want, got = _run(seed, shape, inputs), _run(out, shape, inputs)
    assert np.isfinite(want).all() and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    exact = np.einsum("htl,hld->htd", np.maximum(np.einsum("htd,hld->htl", inputs["q"], inputs["k"]), 0), inputs["v"])
    # the probabilities rounded to bf16 (2^-9 relative) before the second product: ~1e-3 of the largest output
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-2 * np.abs(exact).max())


@pytest.mark.parametrize("text", [MHA.seed_text(), RELU], ids=["mha", "relu"])
def test_the_children_lower_and_compile(text, tmp_path):
    low = lower(_ws(text), "ws.cake")
    assert low.ok, [d.message for d in low.diagnostics]
    if compile_mod.nvcc_path() is not None:
        c = compile_kernel(low.value, cache_dir=tmp_path)
        assert c.ok, [d.message for d in c.diagnostics]
        assert c.value.resources.spill_bytes == 0
        assert "C75" not in c.artifacts["nvcc.log"], c.artifacts["nvcc.log"]      # no serialised wgmma


@pytest.mark.parametrize("name", ["pipeline_wgmma", "consumer_warpgroups", "multicast", "group_tiles", "persistent"])
def test_the_structural_tactics_take_the_warp_specialised_attention_further(name):
    ws = _ws(MHA.seed_text())
    out = apply(name, ws, np.random.default_rng(2), {"H": 2, "T": 257, "DH": 128})
    assert not isinstance(out, Refused), out.reason
    assert out != ws and check_text(out.text(), "child.cake") == []
    shapes = [{"H": 2, "T": 200, "DH": 64}, {"H": 1, "T": 257, "DH": 120}]
    result = check_stage(parse_program(out.text(), "child.cake"), MHA, shapes, seed=5, strict=False)
    assert all(v.correct for v in result.value), [(v.shape, v.message) for v in result.value]


@pytest.mark.parametrize("old,new,why", [
    # the first product's accumulator kept across trips: no fresh product per trip
    ("        fill(s)\n        mma(s, q_s, kt_s)\n", "        mma(s, q_s, kt_s)\n", "zero-filled on every trip"),
    # the second product's a read from somewhere else than a cast of the first
    ("        cast(p_s, s)\n", "", "not written by one cast"),
    # a reduction across rows
    ("        ewise(s, s, s, fn=\"max\", beta=0.0)\n", "        reduce(r_s, s, axis=0)\n", "across rows"),
    # the first product's b read as loaded (N-major), not transposed
    ("        mma(s, q_s, kt_s)\n", "        mma(s, q_s, k_s)\n", "transpose"),
], ids=["running_first", "no_cast", "reduce_rows", "b_not_transposed"])
def test_what_is_no_chained_mainloop_is_refused_with_the_reason(old, new, why):
    assert old in RELU
    text = RELU.replace(old, new, 1).replace("    acc = rmem(f32, (BM, E))\n",
                                              "    acc = rmem(f32, (BM, E))\n    r_s = smem(f32, (1, BN))\n")
    with pytest.raises(Refused) as e:
        find_chained(parse_program(text, "x.cake"))
    assert why in e.value.reason, e.value.reason


def test_a_single_gemm_is_refused_by_both_recognisers_with_both_reasons():
    gemm = parse_program(get_problem("gemm_bf16").seed_text())
    with pytest.raises(Refused) as e:
        find_chained(gemm)
    assert "holds 1 mma" in e.value.reason
    moe = parse_program(get_problem("moe").seed_text())
    out = apply("warp_specialize", moe, np.random.default_rng(0), None)
    assert isinstance(out, Refused) and "as a chained mainloop:" in out.reason


@pytest.mark.parametrize("prob", ["mha", "gemm_bf16"])
def test_warp_specialize_drops_the_co_residency_its_parent_asked_for(prob):
    # setmaxnreg roles own their SM (resources.ctas_per_sm): a role-free parent's occupancy does not carry over
    from dataclasses import replace
    parent = replace(parse_program(get_problem(prob).seed_text()), ctas_per_sm=2)
    out = apply("warp_specialize", parent, np.random.default_rng(0), None)
    assert not isinstance(out, Refused) and out.ctas_per_sm == 0
    assert not [d for d in verify(out) if d.is_error and d.rule == "resources.ctas_per_sm"]
