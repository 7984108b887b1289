"""knn_search: flashlib's KNN contract (a batch of searches, each against its own database, or against the queries
themselves; indices and squared distances out, nearest first). The oracle is a brute-force sort; the comparison
takes ties in any order and nothing else; the naive seed passes the gate on the small set (batches, self-searches,
D = 1 and k = M included, strict shapes too), is refused past its top-k list, compiles, and planted mistakes are
wrong."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

from seed_build import compiled_seed

P = get_problem("knn_search")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("knn_search_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def _brute(x, k):
    """Every squared distance in fp64 and the k nearest by a stable full sort, per batch."""
    q, db = x["q"].astype(np.float64), x["db"].astype(np.float64)
    d = ((q[:, :, None, :] - db[:, None, :, :]) ** 2).sum(-1)                      # (B, Q, M)
    order = np.argsort(d, axis=2, kind="stable")[:, :, :k]
    return d, order, np.take_along_axis(d, order, axis=2)


@pytest.mark.parametrize("shape", [{"B": 2, "Q": 9, "M": 31, "D": 5, "k": 7, "S": 2},
                                   {"B": 2, "Q": 12, "M": 12, "D": 3, "k": 5, "S": 1},
                                   {"B": 1, "Q": 40, "M": 40, "D": 1, "k": 40, "S": 1}])
def test_the_oracle_is_a_brute_force_sort_up_to_ties(shape):
    x = P.make_inputs(shape, np.random.default_rng(5))
    want = P.oracle(x)
    d, order, dk = _brute(x, shape["k"])
    assert want["idx"].shape == want["dists"].shape == (shape["B"], shape["Q"], shape["k"])
    np.testing.assert_allclose(want["dists"], dk, rtol=1e-12, atol=1e-12)
    # the oracle's rows are at the distances it says (an equal-distance row may stand for another)
    got = np.take_along_axis(d, want["idx"], axis=2)
    np.testing.assert_allclose(got, want["dists"], rtol=1e-12, atol=1e-12)
    assert P.compare({"idx": order.astype(np.int32), "dists": dk.astype(np.float32)}, want)[0]
    if shape["S"] == 1:          # a self-search: the database is the queries, and a query is its own nearest
        np.testing.assert_array_equal(x["q"], x["db"])
        assert np.all(want["dists"][:, :, 0] == 0)
    if shape["D"] == 1:          # bf16 values on a line repeat: exact ties, which the sort breaks one way
        assert len(np.unique(x["q"])) < shape["Q"]


@pytest.mark.parametrize("shape", [{"B": 1, "Q": 64, "M": 200, "D": 16, "k": 10, "S": 2},
                                   {"B": 1, "Q": 200, "M": 200, "D": 16, "k": 10, "S": 1},
                                   {"B": 2, "Q": 100, "M": 100, "D": 128, "k": 10, "S": 1}])
def test_a_ranking_by_bf16_rounded_scores_is_wrong_in_a_search_and_in_a_self_search(shape):
    # the inputs plant near ties (a self-search among a point's neighbours after itself) that only a score kept
    # in fp32 orders: ||db||^2 - 2 q.db rounded to bf16 before the top-k picks some of them the wrong way round
    x = P.make_inputs(shape, np.random.default_rng(0))
    q, db = x["q"].astype(np.float64), x["db"].astype(np.float64)
    scores = bf16_round(((db * db).sum(-1)[:, None, :] - 2 * np.einsum("bqd,bmd->bqm", q, db)).astype(np.float32))
    idx = np.argsort(scores, axis=2, kind="stable")[:, :, :shape["k"]]
    d = ((q[:, :, None, :] - db[:, None, :, :]) ** 2).sum(-1)
    got = {"idx": idx.astype(np.float32), "dists": np.take_along_axis(d, idx, axis=2).astype(np.float32)}
    ok, err, msg = P.compare(got, P.oracle(x))
    assert not ok and msg.startswith("idx: position") and err > P.rtol


def test_the_row_oracle_agrees_on_a_batched_self_search():
    shape = {"B": 2, "Q": 20, "M": 20, "D": 6, "k": 4, "S": 1}
    x = P.make_inputs(shape, np.random.default_rng(2))
    full = P.oracle(x)
    rows = np.array([0, 7, 20, 39])
    sub = P.oracle_rows(x, rows)
    for n in ("idx", "dists"):
        np.testing.assert_array_equal(sub[n], full[n].reshape(40, 4)[rows])
    cut = P.take_rows({n: full[n].astype(np.float32) for n in ("idx", "dists")}, rows, shape)
    assert P.compare(cut, sub)[0]
    assert list(P.rows.rows_of_perturbed(x, np.array([0, 20 * 6 + 5, 39 * 6]))) == [0, 20, 39]


def _answer():
    """A query, a database with an exact tie (rows 1 and 3 the same point), a near tie (rows 1 and 2, 1e-4 apart
    relative) and a far row (4); the oracle's answer and the exact distances."""
    q = np.array([[[1.0, 0.0, 0.0, 0.0]]], np.float32)
    db = np.array([[[1.0, 0.0, 0.0, 0.5],
                    [0.0, 0.0, 0.0, 0.0],
                    [0.0, 0.0, 0.0, 0.0078125],          # 2^-7: distance 1 + 2^-14, 6e-5 relative from row 1's
                    [0.0, 0.0, 0.0, 0.0],
                    [-4.0, 0.0, 0.0, 0.0]]], np.float32)
    x = {"q": q, "db": db, "_k": np.array(4)}
    return x, P.oracle(x)


def _got(idx, dists=None, x=None):
    idx = np.asarray(idx, np.float32).reshape(1, 1, -1)
    if dists is None:
        q, db = x["q"].astype(np.float64), x["db"].astype(np.float64)
        dists = ((q[0, 0] - db[0, idx[0, 0].astype(int)]) ** 2).sum(-1)
    return {"idx": idx, "dists": np.asarray(dists, np.float32).reshape(1, 1, -1)}


def test_the_comparison_takes_a_tie_or_a_near_tie_in_either_order_and_nothing_else():
    x, want = _answer()
    assert want["idx"][0, 0, 0] == 0
    for order in ([0, 1, 3, 2], [0, 3, 1, 2], [0, 1, 2, 3], [0, 3, 2, 1]):     # equal, then 6e-5 apart: any order
        ok, err, msg = P.compare(_got(order, x=x), want)
        assert ok and err <= P.rtol, (order, msg)
    ok, err, msg = P.compare(_got([0, 1, 3, 4], x=x), want)                      # the far row for the 4th
    assert not ok and msg.startswith("idx: position 3") and "row 4" in msg
    ok, _, msg = P.compare(_got([1, 0, 3, 2], x=x), want)                        # out of order
    assert not ok and msg.startswith("idx: position")
    assert "twice" in P.compare(_got([0, 1, 1, 2], x=x), want)[2]
    assert "not indices in [0, 5)" in P.compare(_got([0, 1, 3, 5], dists=[0.25, 1, 1, 1]), want)[2]
    assert "non-finite" in P.compare(_got([0, 1, 3, np.nan], dists=[0.25, 1, 1, 1]), want)[2]


def test_the_comparison_checks_the_distances_it_is_given():
    x, want = _answer()
    right = _got([0, 1, 3, 2], x=x)
    assert P.compare(right, want)[0]
    for bad in (right["dists"] * 1.01, right["dists"] - right["dists"] ** 0.5 / 100, np.full((1, 1, 4), np.nan)):
        ok, err, msg = P.compare({**right, "dists": bad.astype(np.float32)}, want)
        assert not ok and msg.startswith("dists:"), msg
    near = right["dists"].copy()
    near[0, 0, 0] = 0.25 * (1 + 5e-4)                                          # within rtol
    assert P.compare({**right, "dists": near}, want)[0]
    # a distance of 0 (a self-search's own row) computed as ||q||^2 + ||db||^2 - 2 q.db in fp32 comes out a
    # little off: judged against 1e-2 of ||q||^2 + ||db||^2 = 2 (1e-3 x 0.02 = 2e-5), not against 0
    x = {"q": np.array([[[1.0, 0.0]]], np.float32), "db": np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32),
         "_k": np.array(2)}
    want = P.oracle(x)
    idx = np.array([[[0, 1]]], np.float32)
    assert P.compare({"idx": idx, "dists": np.array([[[1e-5, 2.0]]], np.float32)}, want)[0]
    ok, _, msg = P.compare({"idx": idx, "dists": np.array([[[1e-3, 2.0]]], np.float32)}, want)
    assert not ok and msg.startswith("dists: position 0")


def test_a_self_search_that_leaves_out_the_query_itself_is_wrong():
    shape = {"B": 1, "Q": 30, "M": 30, "D": 8, "k": 4, "S": 1}
    x = P.make_inputs(shape, np.random.default_rng(9))
    want = P.oracle(x)
    d, order, _ = _brute(x, 5)
    assert np.all(order[0, :, 0] == np.arange(30))                   # each query's nearest is itself
    skip = order[:, :, 1:5]
    got = {"idx": skip.astype(np.float32), "dists": np.take_along_axis(d, skip, axis=2).astype(np.float32)}
    ok, _, msg = P.compare(got, want)
    assert not ok and msg.startswith("idx: position 0")


def test_the_shape_rule_says_what_a_self_search_needs():
    assert P.shape_error({"B": 1, "Q": 8, "M": 9, "D": 4, "k": 2, "S": 1}).startswith("S = 1 is a self-search")
    assert "1 (a self-search" in P.shape_error({"B": 1, "Q": 8, "M": 8, "D": 4, "k": 2, "S": 3})
    assert "fewer database rows than k" in P.shape_error({"B": 1, "Q": 8, "M": 4, "D": 4, "k": 5, "S": 2})
    assert P.shape_error({"B": 2, "Q": 8, "M": 8, "D": 4, "k": 8, "S": 1}) == ""


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "knn_search.cake") == []
    small = _small()
    assert {s["S"] for s in small} == {1, 2} and {s["B"] for s in small} == {1, 2}
    assert any(s["D"] == 1 for s in small) and any(s["k"] == s["M"] for s in small)
    result = check_stage(parse_program(SEED, "knn_search.cake"), P, small, seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert len(result.value) > len(small)                            # its strict shapes too
    assert all(v.max_error < P.rtol for v in result.value)


def _planted(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


@pytest.mark.parametrize("case, says", [
    ("no_query_norm", "dists:"),                 # the distances lack ||q||^2 (the ranking does not need it)
    ("no_database_norm", "idx:"),                # ranked by -2 q.db alone
    ("other_batch", "idx:"),                     # batch b searches batch b + 1's database
    ("tile_base_dropped", "idx:"),               # indices within the tile, not the database
    ("padded_rows_taken", "idx:"),               # the zero rows past M compete (and win the origin's queries)
])
def test_a_planted_mistake_is_wrong(case, says):
    text = {
        "no_query_norm": _planted("    ewise(top_v, top_v, q_nrm)\n", ""),
        "no_database_norm": _planted("            ewise(norm, norm, part)\n", ""),
        "other_batch": _planted("load(db_s, db[bid.y, ", "load(db_s, db[(bid.y + 1) % B, "),
        "tile_base_dropped": _planted("base=mt * BM, limit=M)", "base=0, limit=M)"),
        "padded_rows_taken": _planted("base=mt * BM, limit=M)", "base=mt * BM, limit=M + BM)"),
    }[case]
    assert check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small(), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert wrong and all(v.message.startswith(says) or v.message.startswith("idx:") for v in wrong), \
        [v.message for v in wrong]
    assert any(v.message.startswith(says) for v in wrong)


def test_a_shape_past_the_top_k_list_is_refused_before_it_runs():
    small_list = _planted('"KMAX": 128', '"KMAX": 16')
    result = check_stage(parse_program(small_list, "kmax16.cake"), P, _small(), seed=4, strict=False)
    refused = [v.shape for v in result.value if v.message.startswith("refused:")]
    assert refused == [v.shape for v in result.value if int(v.shape.split("k=")[1].split(",")[0]) > 16] != []
    assert all("k = " in v.message and "> 16" in v.message for v in result.value if v.shape in refused)
    past = {"B": 1, "Q": 3, "M": 140, "D": 4, "k": 129, "S": 2}
    result = check_stage(parse_program(SEED, "knn_search.cake"), P, [past], seed=4, strict=False)
    assert result.value[0].message.startswith("refused:") and "k = 129 > 128" in result.value[0].message
    # a kernel that reads batch 0 only serves B = 1, and says so
    one_batch = _planted("load(db_s, db[bid.y, ", "load(db_s, db[0, ")
    result = check_stage(parse_program(one_batch, "one_batch.cake"), P, _small(), seed=4, strict=False)
    assert all(v.message.startswith("refused:") and "B = 2 > 1" in v.message
               for v in result.value if v.shape.startswith("B=2"))
    assert all(v.correct for v in result.value if v.shape.startswith("B=1"))


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    compiled = compiled_seed(P, tmp_path)
    assert compiled.resources.spill_bytes == 0
