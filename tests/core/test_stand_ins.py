"""Which kernel stands in on a portfolio row its region's finalists serve badly (``pipeline.stand_ins``), on the
KNN search problem's own kernels and small shapes: the split kernels need ``D % 8 == 0`` and ``k <= 32``,
``knn_search_split_unaligned`` takes any ``D`` but ``k <= 32``, the smem-list ``_k64`` kernel any ``D`` and
``k <= 64``."""
from __future__ import annotations

from cake_core.ir.text import parse_program
from cake_core.pipeline.stand_ins import stand_ins
from cake_core.problems import get_problem, shape_key

PROB = get_problem("knn_search")
ROWS = PROB.shape_set("knn_search_small").shapes


def _k(name: str):
    return name, parse_program(PROB.kernel_text(f"{name}.cake"))


SPLIT, UNALIGNED, K64 = _k("knn_search_split"), _k("knn_search_split_unaligned"), _k("knn_search_split_k64")


def _keys(picks):
    return {aid: [shape_key(s) for s in rows] for aid, rows in picks.items()}


def test_each_row_gets_the_best_ranked_kernel_that_holds_it_unless_a_finalist_is_that_kernel():
    picks = stand_ins([SPLIT, UNALIGNED, K64], {SPLIT[0]}, ROWS)
    odd_d = [s for s in ROWS if s["D"] % 8 and s["k"] <= 32]
    big_k = [s for s in ROWS if s["k"] > 32]
    assert odd_d and big_k
    assert _keys(picks) == {UNALIGNED[0]: [shape_key(s) for s in odd_d], K64[0]: [shape_key(s) for s in big_k]}


def test_no_stand_in_where_the_best_ranked_holder_is_a_finalist_or_no_kernel_holds_the_row():
    assert stand_ins([SPLIT, UNALIGNED, K64], {SPLIT[0], UNALIGNED[0], K64[0]}, ROWS) == {}
    # the ranking decides: with the k64 kernel ranked first it holds every row, and it is the finalist
    assert stand_ins([K64, SPLIT, UNALIGNED], {K64[0]}, ROWS) == {}
    # rows only an unranked kernel would hold get nothing
    big_k = [s for s in ROWS if s["k"] > 32]
    assert stand_ins([SPLIT, UNALIGNED], set(), big_k) == {}
