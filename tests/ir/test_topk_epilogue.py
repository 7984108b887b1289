"""topk_bias and sqnorm_rows: the knn_topk_ws seed passes every rule, a planted mistake fails with its rule id at
the right line, the protocol checker sees the norms published by the producer's arrive, and the interpreter's
semantics of both ops."""
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from planting import assert_fires_at_its_line
from cake_core.problems import corpus_file

SEED = corpus_file("knn_topk_ws.cake").read_text()
EPI = "topk_bias(top_v, top_i, acc, nrm_s[t % S], base=t * BN, limit=N)"
NORM0 = "sqnorm_rows(nrm_s[(t - L) % S], db_s[(t - L) % S * 2])"

# rule id -> (old, new, line of the diagnostic)
PLANTED = {
    "topk_bias.acc": ("        acc = rmem(f32, (BM, BN))\n",
                      "        acc = rmem(f32, (BM, BN))\n        acc2 = rmem(f32, (BM, BN))\n", 37),
    "topk_bias.shape": ("top_v = rmem(f32, (BM, KMAX), fill=inf)", "top_v = rmem(f32, (BM, 64), fill=inf)", 36),
    "topk_bias.dtype": ("top_i = rmem(i32, (BM, KMAX), fill=-1.0)", "top_i = rmem(f32, (BM, KMAX), fill=-1.0)", 36),
    "sqnorm_rows.operands": ("nrm_s = smem(f32, (BN,), stages=5)", "nrm_s = smem(f32, (BM // 2,), stages=5)", 17),
}
# topk_bias.acc: dots is a plain rmem tile, not the accumulator (the plant also renames the operand)
_RENAME = {"topk_bias.acc": (EPI, EPI.replace("acc,", "acc2,"))}


def test_the_knn_ws_seed_passes_every_rule():
    assert check_text(SEED, "knn_topk_ws.cake") == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    assert_fires_at_its_line(SEED, PLANTED, _RENAME, rule_id)


def test_sqnorm_rows_of_a_two_span_row_is_refused():
    text = SEED.replace("db_s = smem(bf16, (BN, BK), stages=10", "db_s = smem(bf16, (BN, 2 * BK), stages=10")
    assert any(d.rule == "sqnorm_rows.operands" and d.line == 17 for d in check_text(text))


def test_kmax_past_the_register_budget_is_refused():
    text = SEED.replace('"KMAX": 16', '"KMAX": 40')
    assert any(d.rule == "topk_bias.shape" and "KMAX <= 32" in d.message for d in check_text(text))


def test_lists_are_exempt_from_the_rmem_split():
    # top_v/top_i (128, 16) over the 256 consumer threads: fragment lists, not a distributed tile
    assert not [d for d in check_text(SEED) if d.rule == "resources.rmem_split"]


def test_the_protocol_checker_wants_the_ready_wait_before_the_norms_are_read():
    # without the wait on `ready` the consumers may read norms the producer has not written (topk_bias, line
    # 36 less the removed line)
    text = SEED.replace("            wait(ready[t % S], phase=t // S % 2)\n", "")
    hits = [d for d in check_text(text) if d.rule == "protocol.read_before_ready"]
    assert hits and hits[0].line == 35, [d.rule for d in check_text(text)]


def test_the_protocol_checker_wants_the_norms_computed_after_the_tile_landed():
    text = SEED.replace("                wait(full[(t - L) % S], phase=(t - L) // S % 2)\n", "")
    hits = [d for d in check_text(text) if d.rule == "protocol.read_before_ready"]
    assert hits and hits[0].line == 16      # the first sqnorm_rows (the lines below moved up one)


_TINY = '''@kernel(target="sm_90a", grid=(1,), threads=256, consts={"BK": 64, "BN": 64, "BM": 64, "KMAX": 8})
def tiny(a: gmem[bf16, (BM, BK)], b: gmem[bf16, (N, BK)], out: gmem[i32, (BM, k)], vals: gmem[f32, (BM, k)]):
    a_s = smem(bf16, (BM, BK), swizzle=128)
    b_s = smem(bf16, (BN, BK), swizzle=128)
    w_s = smem(f32, (BN,))
    bar = mbarrier(1)
    ready = mbarrier(1)
    with role("norms", warps=(0, 4)):
        expect_tx(bar[0], (BM * BK + BN * BK) * 2)
        tma_load(a_s, a[tile(0, BM), :], bar=bar[0])
        tma_load(b_s, b[tile(0, BN), :], bar=bar[0])
        wait(bar[0], phase=0)
        sqnorm_rows(w_s, b_s)
        arrive(ready[0])
    with role("mma", warps=(4, 8)):
        acc = rmem(f32, (BM, BN), fill=5.0)
        top_v = rmem(f32, (BM, KMAX), fill=inf)
        top_i = rmem(i32, (BM, KMAX), fill=-1.0)
        wait(bar[0], phase=0)
        wait(ready[0], phase=0)
        wgmma(acc, a_s, b_s, b_major="k", accumulate=False)
        wgmma_wait(0)
        topk_bias(top_v, top_i, acc, w_s, base=0, limit=N)
        store(out[:, tile(0, KMAX)], top_i)
        store(vals[:, tile(0, KMAX)], top_v)
'''


@pytest.mark.parametrize("n,k", [(64, 8), (40, 5), (6, 6)])
def test_interpreter_sqnorm_rows_and_topk_bias(n, k):
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (64, 64)).astype(np.float32)
    b = rng.integers(-3, 4, (n, 64)).astype(np.float32)
    out = {"out": np.full((64, k), -7, np.float32), "vals": np.full((64, k), np.nan, np.float32)}
    interp.run(parse_program(_TINY), {"N": n, "k": k}, {"a": a, "b": b}, out)
    scores = (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)          # the fill of 5 is dropped
    want = np.stack([np.lexsort((np.arange(n), s))[:k] for s in scores])   # by score, then index
    assert (out["out"] == want).all()
    assert np.array_equal(out["vals"], np.take_along_axis(scores, want, 1))


def test_tiny_program_passes_the_verifier():
    assert check_text(_TINY) == []
