"""topk_bias over lists kept in shared memory (KMAX up to 128, where register lists stop at 32): the rules that
accept them and refuse the mistakes (rmem lists past 32, smem lists past 128, ringed tiles, mixed spaces, a
missing fill or role_sync, an op that would read a list by position), and the interpreter against the oracle with
k near KMAX. The lowering and nvcc are tests/lower/test_lower_topk_smem.py; the GPU gate of the four kernels is
tests/runtime/test_knn_smem_lists.py."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.problems import corpus_file, get_problem
from cake_core.runtime.cpu import check_on_cpu

K64 = corpus_file("knn_search_split_k64.cake").read_text()
FILLS = "        fill(top_v, value=inf)\n        fill(top_i, value=-1.0)\n        role_sync()\n"


def _plant(old: str, new: str, text: str = K64) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _errors(text: str) -> list[tuple[str, str]]:
    return [(d.rule, d.message) for d in check_text(text) if d.is_error]


@pytest.mark.parametrize("file", ["knn_search_split_k64.cake", "knn_search_split_k128.cake",
                                  "knn_topk_split_k64.cake", "knn_topk_split_k128.cake"])
def test_the_smem_list_kernels_are_canonical_and_pass_every_rule(file):
    text = corpus_file(file).read_text()
    assert parse_program(text).text() == text
    assert check_text(text) == []


def test_register_lists_past_32_are_refused_and_smem_lists_past_128_too():
    rmem = _plant("    top_v = smem(f32, (BM, KMAX))\n    top_i = smem(i32, (BM, KMAX))\n", "")
    rmem = _plant(FILLS, "        top_v = rmem(f32, (BM, KMAX), fill=inf)\n"
                         "        top_i = rmem(i32, (BM, KMAX), fill=-1.0)\n", rmem)
    errs = _errors(rmem)
    assert errs and all(r == "topk_bias.shape" for r, _ in errs), errs
    assert any("<= 32 in rmem" in m for _, m in errs), errs
    wide = _plant('"KMAX": 64', '"KMAX": 256')
    errs = _errors(wide)
    assert any(r == "topk_bias.shape" and "<= 128 in smem" in m for r, m in errs), errs


def test_ringed_or_mixed_space_lists_are_refused():
    ringed = _plant("    top_i = smem(i32, (BM, KMAX))\n", "    top_i = smem(i32, (BM, KMAX), stages=2)\n")
    assert any(r == "topk_bias.acc" and "top_i" in m for r, m in _errors(ringed)), _errors(ringed)
    mixed = _plant("    top_i = smem(i32, (BM, KMAX))\n", "")
    mixed = _plant("        fill(top_i, value=-1.0)\n", "        top_i = rmem(i32, (BM, 32), fill=-1.0)\n", mixed)
    assert any(r == "topk_bias.shape" and "different memory spaces" in m for r, m in _errors(mixed))


def test_smem_lists_need_their_fill_and_a_role_sync_before_the_loop():
    no_sync = _plant("        role_sync()\n", "")
    errs = _errors(no_sync)
    assert [r for r, _ in errs] == ["topk_bias.smem_init", "topk_bias.smem_init"], errs
    assert "no role_sync" in errs[0][1]
    no_fill = _plant("        fill(top_i, value=-1.0)\n", "")
    errs = [(r, m) for r, m in _errors(no_fill) if r.startswith("topk")]
    assert errs == [("topk_bias.smem_init", "smem list `top_i` is not filled in this role before topk_bias")], errs
    # the protocol checker sees it too: the lists are read before anything wrote them
    assert any(r == "protocol.read_before_ready" for r, _ in _errors(no_fill))


def test_an_op_that_reads_an_smem_list_by_position_is_refused():
    # the lowering swizzles each row's pairs (cake_topk_smem.cuh, list_slot): a store of the list would write them
    # out of order on the GPU while the interpreter, which keeps them in order, passed it
    stored = _plant("        topk_publish(pub_v, pub_i, top_v, top_i)\n",
                    "        topk_publish(pub_v, pub_i, top_v, top_i)\n"
                    "        store(dists[bid.z, tile(bid.x, BM), tile(0, KMAX)], top_v)\n")
    errs = [(r, m) for r, m in _errors(stored) if r == "topk_bias.smem_private"]
    assert errs == [("topk_bias.smem_private", "`store` names `top_v`, an smem list of topk_bias, whose pairs are "
                                               "laid out for topk_bias alone")], _errors(stored)
    # fill, topk_shift and topk_publish name them in every smem-list kernel, which pass (above)
    assert "topk_bias.smem_private" not in {r for r, _ in _errors(K64)}


@pytest.mark.parametrize("file,problem,shapes", [
    ("knn_search_split_k64.cake", "knn_search",
     [{"B": 2, "Q": 70, "M": 1100, "D": 40, "k": 64, "S": 2}, {"B": 1, "Q": 3, "M": 300, "D": 8, "k": 50, "S": 2}]),
    ("knn_topk_split_k128.cake", "knn_topk", [{"Q": 70, "N": 1100, "D": 40, "k": 118}, {"Q": 65, "N": 129, "D": 16,
                                                                                     "k": 128}]),
])
def test_the_interpreter_reproduces_the_oracle_with_k_near_kmax(file, problem, shapes):
    checks = check_on_cpu(parse_program(corpus_file(file).read_text()), get_problem(problem), shapes, seed=5)
    assert [c.correct for c in checks] == [True] * len(shapes), [c.message for c in checks]


def test_a_list_that_is_never_reset_fails_in_the_interpreter():
    # the lists start at +inf so any score enters; lists filled with 0 keep the fill's -1 indices instead
    bad = _plant("        fill(top_v, value=inf)\n", "        fill(top_v, value=0.0)\n")
    (c,) = check_on_cpu(parse_program(bad), get_problem("knn_search"),
                        [{"B": 1, "Q": 70, "M": 1100, "D": 40, "k": 64, "S": 2}], seed=5)
    assert not c.correct
