"""The strict gate (runtime.strict + the near ties of the distance problems): shapes chosen per program
from its tiles, rings and thresholds; the honest kernels pass them; kernels that score in bf16 or skip
the centroids past 256 fail them, for those reasons."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.domain import domain_violations, lets_of
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.problems.base import bf16_round, input_sampler
from cake_core.runtime.cpu import check_on_cpu
from cake_core.runtime.strict import loop_trips, ring_loops, strict_shapes, tile_sizes
from cake_core.problems import corpus_file

KM = get_problem("kmeans_assign")
KNN = get_problem("knn_topk")
GEMM = get_problem("gemm_bf16")


def _program(name: str):
    return parse_program(corpus_file(name).read_text(), name)


@pytest.mark.parametrize("name,problem", [("knn_topk_split_pp.cake", KNN), ("kmeans_assign_ws.cake", KM),
                                          ("gemm_bf16_ws.cake", GEMM), ("tinygemm_cluster2.cake",
                                                                        get_problem("tinygemm"))])
def test_strict_shapes_wrap_every_ring_and_tile_every_dimension_past_a_tail(name, problem):
    prog = _program(name)
    ss = strict_shapes(prog, problem)
    shape = ss.shapes[0]
    assert domain_violations(prog, shape) == [] and problem.shape_error(shape) == ""
    rings = ring_loops(prog)
    assert rings, "these kernels feed a ring"
    for loop, stages in rings:
        assert loop_trips(loop, shape, prog.const_env, lets_of(prog)) > stages, (loop.args[0], loop.line, shape)
    for d, tiles in tile_sizes(prog).items():
        if d != "k":                              # k: a part of one KMAX list (the domain says k <= KMAX)
            # at least two tiles, the last one partial (D under the domain's 128: 64 + a tail of 56)
            assert shape[d] > max(tiles) and all(shape[d] % t for t in tiles), (d, shape)
    assert "wrapping" in ss.why[0]


def test_the_shapes_follow_the_program_not_the_problem():
    small, large = strict_shapes(_program("gemm_bf16.cake"), GEMM), strict_shapes(_program("gemm_bf16_ws.cake"), GEMM)
    assert small.shapes[0] == {"M": 129, "N": 129, "K": 65}     # 64 x 64 tiles, K by 32, no ring
    assert large.shapes[0]["M"] > 256 and large.shapes[0]["K"] > 4 * 64     # 128-row tiles, a 4-stage K ring
    # the domain caps what the tiles would ask for: k <= KMAX, D <= two tiles of 64 with TMA's 8-element rows
    knn = strict_shapes(_program("knn_topk_split_pp.cake"), KNN).shapes[0]
    assert knn["k"] == 15 and knn["D"] == 120
    # no tile runs along B: two batches (CTAs along it), no tail to add
    assert strict_shapes(_program("kmeans_assign.cake"), KM).shapes[0] == {"B": 2, "N": 257, "K": 129, "D": 65}


def test_both_sides_of_a_threshold_the_program_writes():
    ss = strict_shapes(_program("kmeans_update_smem.cake"), get_problem("kmeans_update"))
    ks = sorted(s["K"] for s in ss.shapes)
    assert ks[0] <= 1024 < ks[-1], ss      # `if K <= KMAX` (1024): the smem path and the global one


def test_the_honest_seed_passes_its_strict_shapes():
    prog = parse_program(KM.seed_text())
    ss = strict_shapes(prog, KM)
    small = [{"B": 1, "N": 33, "K": 7, "D": 9}]
    checks = check_on_cpu(prog, KM, small, seed=1, strict=True)
    assert [c.shape for c in checks] == ["B=1,N=33,K=7,D=9"] + [",".join(f"{k}={v}" for k, v in s.items())
                                                               for s in ss.shapes]
    assert all(c.correct for c in checks), [c.message for c in checks]


def _naive_km(old: str, new: str) -> str:
    text = KM.seed_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _bf16_dots(problem, norm: str, tile: str) -> str:
    """The problem's seed with its dot products rounded to bf16 before the score (``norm - 2 dot``)."""
    score = f"        ewise(scores, {norm}, dot, beta=2.0, fn=\"sub\")\n"
    decl = f"    scores = rmem(f32, {tile})\n"
    text = problem.seed_text()
    assert text.count(score) == 1 and text.count(decl) == 1, (score, decl)
    return text.replace(score, "        cast(dot_b, dot)\n        cast(dot, dot_b)\n" + score).replace(
        decl, decl + f"    dot_b = rmem(bf16, {tile})\n")


# the dot products rounded to bf16 before the score (c_sq - 2 x.c) and the argmin: reduced-precision scoring
BF16_SCORES = _bf16_dots(KM, "csq_s", "(BN, BK)")
# the arg-min takes the first 256 centroids only (it reads them all): centroids past 256 are never scored
FIRST_256 = _naive_km("limit=K)", "limit=min(K, 256))")
# the centroid loop stops after 4 tiles of 64: a kernel for K <= 256, as its domain says
CAPPED_256 = _naive_km("    for kt in range(cdiv(K, BK)):", "    for kt in range(min(cdiv(K, BK), 4)):")


def test_bf16_scoring_fails_on_the_near_ties_while_fp32_scoring_passes():
    prog = parse_program(BF16_SCORES)
    shapes = list(strict_shapes(prog, KM).shapes) + list(KM.shape_set("kmeans_assign_small").cpu_shapes(160))
    checks = check_on_cpu(prog, KM, shapes, seed=1)
    assert all(not c.correct and "farther (relative) than the nearest" in c.message for c in checks), \
        [(c.shape, c.message) for c in checks]
    honest = check_on_cpu(parse_program(KM.seed_text()), KM, shapes, seed=1)
    assert all(c.correct for c in honest)


def test_skipping_the_centroids_past_256_fails_the_strict_gate_and_not_the_old_one():
    prog = parse_program(FIRST_256)
    old = KM.shape_set("kmeans_assign_small").cpu_shapes(160)           # every dimension <= 160: never K > 256
    assert all(c.correct for c in check_on_cpu(prog, KM, old, seed=1))
    ss = strict_shapes(prog, KM)
    assert any(s["K"] > 256 for s in ss.shapes) and any("`min` threshold at 257" in w for w in ss.why), ss
    checks = check_on_cpu(prog, KM, list(ss.shapes), seed=1)
    bad = [c for c in checks if not c.correct]
    assert bad and all("farther (relative) than the nearest" in c.message for c in bad)


def test_a_centroid_loop_capped_at_256_is_refused_past_it_not_run():
    prog = parse_program(CAPPED_256)
    assert all(s["K"] <= 256 for s in strict_shapes(prog, KM).shapes)
    (c,) = check_on_cpu(prog, KM, [{"B": 1, "N": 40, "K": 257, "D": 16}], seed=1)
    assert c.refused and not c.correct and "K = 257 > 256" in c.message and "`c`" in c.message
    (ok,) = check_on_cpu(prog, KM, [{"B": 1, "N": 40, "K": 256, "D": 16}], seed=1)
    assert ok.correct, ok.message


def test_near_ties_are_planted_and_ordered_by_fp32_not_by_bf16():
    shape = {"B": 2, "N": 200, "K": 50, "D": 32}
    x = KM.make_inputs(shape, input_sampler(5, shape))
    want = KM.oracle(x)
    d = ((x["x"][:, :, None, :].astype(np.float64) - x["c"][:, None, :, :]) ** 2).sum(-1)
    two = np.sort(d, axis=2)[:, :, :2]
    gap = (two[:, :, 1] - two[:, :, 0]) / two[:, :, 0]
    planted = (gap > 1e-3) & (gap < 1e-2)      # the nearer of a pair wins by more than rtol, less than 1 %
    assert planted.mean() > 0.2
    dots = np.einsum("bnd,bkd->bnk", x["x"], x["c"])
    for scores, ok in ((x["c_sq"][:, None] - 2 * dots, True), (x["c_sq"][:, None] - 2 * bf16_round(dots), False)):
        got = np.argmin(scores, axis=2).astype(np.float32)
        assert KM.compare({"out": got}, want)[0] is ok


# the dot products rounded to bf16 before the score (|db|^2 - 2 q.db) and the top-k: reduced-precision ranking
KNN_BF16 = _bf16_dots(KNN, "norm", "(BQ, BN)")


def test_bf16_ranking_fails_the_knn_gate_on_the_near_ties_while_fp32_ranking_passes():
    assert "accumulated in fp32 (or wider)" in KNN.description
    shapes = [{"Q": 64, "N": 160, "D": 32, "k": 10}] + list(strict_shapes(parse_program(KNN_BF16), KNN).shapes)
    checks = check_on_cpu(parse_program(KNN_BF16), KNN, shapes, seed=1)
    # a near-tie pair ranked the wrong way round: the returned row is farther than the true j-th nearest
    assert all(not c.correct and "-th nearest is at" in c.message for c in checks), \
        [(c.shape, c.message) for c in checks]
    honest = check_on_cpu(parse_program(KNN.seed_text()), KNN, shapes, seed=1)
    assert all(c.correct for c in honest), [(c.shape, c.message) for c in honest]
