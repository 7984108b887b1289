"""The K-major wgmma b and the argmin_bias epilogue: the kmeans_assign_ws seed passes every rule, a planted
mistake fails with its rule id at the right line, and the interpreter's semantics of both."""
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from planting import assert_fires_at_its_line
from cake_core.problems import corpus_file

SEED = corpus_file("kmeans_assign_ws.cake").read_text()
C_B = "c_b = smem(bf16, (BN, BK), stages=4, swizzle=128)"
EPI0 = "argmin_bias(best, arg, acc0, csq_a[kp % S], base=2 * kp * BN, limit=K)"

# rule id -> (old, new, line of the diagnostic)
PLANTED = {
    "wgmma.b_major": (C_B, C_B.replace("(BN, BK)", "(BN, 2 * BK)"), 39),
    "argmin_bias.acc": ("        acc1 = rmem(f32, (BM, BN))\n",
                        "        acc1 = rmem(f32, (BM, BN))\n        acc2 = rmem(f32, (BM, BN))\n", 43),
    "argmin_bias.shape": ("best = rmem(f32, (BM,), fill=inf)", "best = rmem(f32, (BM // 2,), fill=inf)", 42),
    "argmin_bias.dtype": ("arg = rmem(i32, (BM,))", "arg = rmem(f32, (BM,))", 42),
}
# argmin_bias.acc: dots is a plain rmem tile, not the accumulator (the plant also renames the operand)
_RENAME = {"argmin_bias.acc": (EPI0, EPI0.replace("acc0", "acc2"))}


def test_the_kmeans_ws_seed_passes_every_rule():
    assert check_text(SEED, "kmeans_assign_ws.cake") == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    assert_fires_at_its_line(SEED, PLANTED, _RENAME, rule_id)


def test_k_major_b_counts_n_from_its_rows():
    # b (64, BK) K-major: N = 64 rows against a 128-column accumulator
    text = SEED.replace("c_a = smem(bf16, (BN, BK)", "c_a = smem(bf16, (64, BK)", 1)
    assert any(d.rule == "wgmma.n" and d.line == 36 and "64 rows" in d.message for d in check_text(text))
    # and K from its columns: a (BM, 64) against b (BN, 32)
    text = SEED.replace(C_B, C_B.replace("(BN, BK)", "(BN, BK // 2)"), 1)
    assert any(d.rule == "wgmma.k" and d.line == 39 for d in check_text(text))


def test_row_state_is_exempt_from_the_rmem_split():
    # best/arg (128,) over the 256 consumer threads: fragment row state, not a distributed tile
    assert not [d for d in check_text(SEED) if d.rule == "resources.rmem_split"]
    text = SEED.replace("        arg = rmem(i32, (BM,))\n", "        arg = rmem(i32, (BM,))\n        spare = rmem(f32, (BM,))\n")
    assert any(d.rule == "resources.rmem_split" and d.line == 33 for d in check_text(text))


_TINY = '''@kernel(target="sm_90a", grid=(1,), threads=128, consts={"BK": 64, "BN": 64, "BM": 64})
def tiny(a: gmem[bf16, (BM, BK)], b: gmem[bf16, (N, BK)], bias: gmem[f32, (N,)], out: gmem[i32, (BM,)]):
    a_s = smem(bf16, (BM, BK), swizzle=128)
    b_s = smem(bf16, (BN, BK), swizzle=128)
    w_s = smem(f32, (BN,))
    bar = mbarrier(1)
    with role("mma", warps=(0, 4)):
        acc = rmem(f32, (BM, BN), fill=5.0)
        best = rmem(f32, (BM,), fill=inf)
        arg = rmem(i32, (BM,))
        expect_tx(bar[0], (BM * BK + BN * BK) * 2 + BN * 4)
        tma_load(a_s, a[tile(0, BM), :], bar=bar[0])
        tma_load(b_s, b[tile(0, BN), :], bar=bar[0])
        tma_load(w_s, bias[tile(0, BN)], bar=bar[0])
        wait(bar[0], phase=0)
        wgmma(acc, a_s, b_s, b_major="k", accumulate=False)
        wgmma_wait(0)
        argmin_bias(best, arg, acc, w_s, base=0, limit=N)
        store(out[:], arg)
'''


@pytest.mark.parametrize("n", [64, 40])
def test_interpreter_k_major_wgmma_and_argmin_bias(n):
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (64, 64)).astype(np.float32)
    b = rng.integers(-3, 4, (n, 64)).astype(np.float32)
    bias = rng.integers(0, 50, n).astype(np.float32)
    out = {"out": np.full(64, -1, np.float32)}
    interp.run(parse_program(_TINY), {"N": n}, {"a": a, "b": b, "bias": bias}, out)
    scores = bias[None, :] - 2.0 * (a @ b.T)          # acc = a @ b.T: the fill of 5 is dropped
    want = np.argmin(scores, axis=1)                  # the first index on ties, columns >= N never taken
    assert (out["out"] == want).all()


def test_tiny_program_passes_the_verifier():
    assert check_text(_TINY) == []
