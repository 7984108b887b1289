"""knn_topk_split: the database split over the CTAs of a (1, SPLIT, 1) cluster, each CTA's top-k lists
published to its smem (topk_publish) and merged across the cluster through distributed shared memory
(topk_cluster_merge). The interpreter against the oracle (ragged tails, empty splits, other SPLITs), the
protocol checker on missing cluster barriers, and the operand rules on planted mistakes."""
from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.protocol import check_protocol
from cake_core.targets import get_arch
from cake_core.ir.text import parse_program
from cake_core.ir.verify import build_ctx
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SPLIT = corpus_file("knn_topk_split.cake").read_text()
KNN = get_problem("knn_topk")
PUBLISH = "        topk_publish(pub_v, pub_i, top_v, top_i)\n"
MERGE = "    topk_cluster_merge(idx[tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)\n"
# 1000 rows: 8 tiles, 2 per CTA, a 104-row last tile; 1300 rows: 11 tiles, 3 + 3 + 3 + 2; 300 rows: 3 tiles,
# the fourth CTA's share empty; 129 rows: 2 tiles, two empty shares
EXTRA = [{"Q": 130, "N": 1000, "D": 128, "k": 10}, {"Q": 5, "N": 1300, "D": 8, "k": 3},
         {"Q": 1, "N": 300, "D": 32, "k": 16}, {"Q": 64, "N": 129, "D": 16, "k": 5}]


def _plant(old: str, new: str, text: str = SPLIT) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _rules(text: str) -> list[tuple[str, int]]:
    return [(d.rule, d.line) for d in check_text(text) if d.is_error]


def test_the_split_seed_is_canonical_and_passes_every_rule():
    assert parse_program(SPLIT).text() == SPLIT
    assert check_text(SPLIT) == []


def test_the_interpreter_reproduces_the_oracle_with_ragged_and_empty_splits():
    aligned = KNN.shape_set("knn_topk_aligned")
    shapes = aligned.cpu_shapes(KNN.cpu_limit) + EXTRA
    checks = check_on_cpu(parse_program(SPLIT), KNN, shapes, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


@pytest.mark.parametrize("split", [1, 2, 3])
def test_other_splits_reproduce_the_oracle(split):
    text = _plant('"SPLIT": 4}', f'"SPLIT": {split}}}')
    assert check_text(text) == []
    checks = check_on_cpu(parse_program(text), KNN, EXTRA[:3], seed=3)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_global_indices_without_the_split_offset_fail_in_the_interpreter():
    wrong = _plant("base=(bid.y * cdiv(cdiv(N, BN), SPLIT) + t) * BN", "base=t * BN")
    checks = check_on_cpu(parse_program(wrong), KNN, [{"Q": 20, "N": 1000, "D": 64, "k": 5}], seed=1)
    assert not checks[0].correct


def test_a_merge_without_the_cluster_sync_after_the_roles_is_a_protocol_finding():
    wrong = _plant("    cluster_sync()\n" + MERGE, MERGE)
    found = [d for d in check_protocol(build_ctx(parse_program(wrong), get_arch("sm_90a")))]
    assert [(d.rule, d.line) for d in found] == [("protocol.cluster_read", 42)], found
    assert "no cluster_sync() between its write and the read" in found[0].message
    assert any("topk_publish at line 41" in w for w in found[0].witness)


def test_exiting_without_a_cluster_sync_after_the_merge_is_a_protocol_finding():
    wrong = _plant(MERGE + "    cluster_sync()\n", MERGE)
    assert _rules(wrong) == [("protocol.cluster_read", 43)]
    assert "may exit" in [d for d in check_text(wrong) if d.is_error][0].message


def test_publish_of_swapped_tiles_or_lists_is_refused():
    swapped = _plant(PUBLISH, PUBLISH.replace("pub_v, pub_i", "pub_i, pub_v"))
    assert ("topk_publish.operands", 41) in _rules(swapped)
    lists = _plant(PUBLISH, PUBLISH.replace("top_v, top_i", "top_i, top_v"))
    assert _rules(lists) == [("topk_publish.operands", 41)]
    ring = _plant("pub_v = smem(f32, (BM, KMAX))", "pub_v = smem(f32, (BM, KMAX), stages=2)")
    assert ("topk_publish.operands", 41) in _rules(ring)


def test_a_merge_of_unpublished_tiles_or_too_wide_a_window_is_refused():
    assert ("topk_cluster_merge.operands", 42) in _rules(_plant(PUBLISH, ""))
    wide = _plant(MERGE, MERGE.replace("tile(0, KMAX)", "tile(0, 2 * KMAX)"))
    assert _rules(wide) == [("topk_cluster_merge.operands", 43)]
    in_role = _plant(PUBLISH + "    cluster_sync()\n" + MERGE, PUBLISH + "    " + MERGE + "    cluster_sync()\n")
    assert ("topk_cluster_merge.operands", 42) in _rules(in_role)
