"""knn_topk_split_pp: knn_topk_split with two one-warpgroup consumer roles taking turns (turn0 / turn1) and
two m64n64 accumulators per role over a pair of 64-row db tiles. A CTA's share of tiles rounds up to whole
pairs: the extra tile (the next CTA's first, or past the tensor) is masked by the share-end limit. The
interpreter against the oracle (ragged tails, odd and empty shares, other SPLITs), the verifier incl. the
protocol checker, and planted mistakes."""
from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
PP = corpus_file("knn_topk_split_pp.cake").read_text()
KNN = get_problem("knn_topk")
LIMIT = "limit=min(N, (bid.y + 1) * cdiv(cdiv(N, BN), SPLIT) * BN))"
# 64-row tiles over 4 CTAs: 700 rows are 11 tiles, 3 + 3 + 3 + 2 (odd shares: each rounds up to a pair
# that reaches into the next CTA's share); 1300 rows, 21 tiles, 6 + 6 + 6 + 3 (the last pair's second tile
# past the tensor); 300 rows, 5 tiles, 2 + 2 + 1 + 0 (an empty share); 129 rows, 3 tiles, 1 + 1 + 1 + 0
EXTRA = [{"Q": 130, "N": 700, "D": 128, "k": 10}, {"Q": 5, "N": 1300, "D": 8, "k": 3},
         {"Q": 1, "N": 300, "D": 32, "k": 16}, {"Q": 64, "N": 129, "D": 16, "k": 5}]


def _plant(old: str, new: str, text: str = PP, count: int = 1) -> str:
    assert text.count(old) == count, old
    return text.replace(old, new)


def test_the_pingpong_seed_is_canonical_and_passes_every_rule_and_the_protocol_checker():
    assert parse_program(PP).text() == PP
    assert check_text(PP) == []                                     # no protocol.undecided either


def test_the_interpreter_reproduces_the_oracle_with_odd_and_empty_shares():
    aligned = KNN.shape_set("knn_topk_aligned")
    shapes = aligned.cpu_shapes(KNN.cpu_limit) + EXTRA
    checks = check_on_cpu(parse_program(PP), KNN, shapes, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


@pytest.mark.parametrize("split", [1, 2, 3])
def test_other_splits_reproduce_the_oracle(split):
    text = _plant('"SPLIT": 4}', f'"SPLIT": {split}}}')
    assert check_text(text) == []
    checks = check_on_cpu(parse_program(text), KNN, EXTRA[:3], seed=3)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_the_extra_tile_of_an_odd_share_without_the_share_limit_returns_rows_twice():
    wrong = _plant(LIMIT, "limit=N)", count=4)
    assert check_text(wrong) == []                                  # legal IR, wrong answer
    (c,) = check_on_cpu(parse_program(wrong), KNN, [EXTRA[0]], seed=1)
    assert not c.correct and "twice" in c.message, c.message


def test_a_role_that_never_passes_the_turn_is_a_protocol_deadlock():
    wrong = _plant("            arrive(turn1[0])\n", "")
    rules = {d.rule for d in check_text(wrong) if d.is_error}
    assert "protocol.deadlock" in rules, rules


def test_second_merge_of_the_first_roles_lists_is_refused():
    merge1 = "topk_cluster_merge(idx[tile(2 * bid.x + 1, BM // 2), tile(0, KMAX)], pub_v1, pub_i1)"
    wrong = _plant(merge1, merge1.replace("pub_v1, pub_i1", "pub_v0, pub_i1"))
    assert "topk_cluster_merge.operands" in {d.rule for d in check_text(wrong) if d.is_error}
