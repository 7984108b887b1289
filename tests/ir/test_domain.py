"""Kernel domains (ir.domain): the bounds derived from the corpus kernels, the refusal of a shape outside
them before anything runs (the CPU gate, `cake run`), and correct answers inside them."""
from __future__ import annotations


import pytest
from typer.testing import CliRunner

from cake_core.errors import CakeError
from cake_core.ir.domain import domain_violations, extent_limit, kernel_domain
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu, run_file
from cake_core.problems import corpus_file

KNN = get_problem("knn_topk")
SPLIT_PP = parse_program(corpus_file("knn_topk_split_pp.cake").read_text(), "knn_topk_split_pp.cake")


def _bounds(name: str) -> set[str]:
    return {b.text() for b in kernel_domain(parse_program(corpus_file(name).read_text(), name))}


def test_the_topk_kernels_bound_k_by_kmax_and_d_by_their_tiles():
    assert _bounds("knn_topk_split_pp.cake") == {"k <= 16", "D <= 128", "2 * D % 16 == 0"}
    assert _bounds("knn_topk.cake") == {"k <= 16"}           # the naive seed loops over D, keeps 16 per query
    assert "D <= 128" in _bounds("kmeans_assign_ws.cake")
    assert _bounds("gemm_bf16.cake") == set()                # guarded tiles over every dimension: no bound


def test_a_large_k_is_refused_with_the_bound_and_its_line():
    shape = {"Q": 130, "N": 300, "D": 64, "k": 40}
    (d,) = domain_violations(SPLIT_PP, shape)
    assert d.rule == "domain.extent" and d.is_error
    assert "k = 40 > 16" in d.message and "tile(0, KMAX)" in d.message and d.line == 83
    (c,) = check_on_cpu(SPLIT_PP, KNN, [shape], seed=1)
    assert c.refused and not c.correct and c.check == "" and "k = 40 > 16" in c.message


def test_d_past_the_tiles_and_misaligned_rows_are_refused():
    rules = sorted(d.rule for d in domain_violations(SPLIT_PP, {"Q": 64, "N": 300, "D": 136, "k": 8}))
    assert rules == ["domain.extent", "domain.extent"]         # q and db are both read up to D = 128 only
    q, db = domain_violations(SPLIT_PP, {"Q": 64, "N": 300, "D": 100, "k": 8})      # one per TMA-copied tensor
    for d, name in ((q, "q"), (db, "db")):
        assert d.rule == "domain.tma_stride" and f"`{name}`" in d.message
        assert "2 * D = 200, not a multiple of 16" in d.message


def test_an_aligned_shape_inside_the_domain_is_accepted_and_correct():
    shape = {"Q": 136, "N": 2200, "D": 120, "k": 16}          # k at KMAX, D two tiles with a tail of 56
    assert domain_violations(SPLIT_PP, shape) == []
    (c,) = check_on_cpu(SPLIT_PP, KNN, [shape], seed=3)
    assert c.correct and not c.refused, c.message


def test_accesses_under_a_branch_the_shape_does_not_take_do_not_bound_it():
    # kmeans_update_smem stores tile(0, KMAX) of the clusters only when K <= KMAX, else adds into all of them
    prog = parse_program(corpus_file("kmeans_update_smem.cake").read_text())
    assert extent_limit(prog, "sums", 1, {"B": 1, "N": 100, "K": 40, "D": 64}) == 1024     # K <= KMAX: the store
    assert extent_limit(prog, "sums", 1, {"B": 1, "N": 100, "K": 2000, "D": 64}) is None   # K > KMAX: `:`
    for K in (40, 2000):
        assert domain_violations(prog, {"B": 1, "N": 100, "K": K, "D": 64}) == []


def test_a_bound_from_a_loop_with_a_static_range():
    text = corpus_file("knn_topk.cake").read_text().replace(
        "    store(idx[tile(bid.x, BQ), tile(0, KMAX)], top_i)",
        "    for j in range(2):\n        store(idx[tile(bid.x, BQ), tile(j, 8)], top_i)")
    prog = parse_program(text)
    assert extent_limit(prog, "idx", 1, {"Q": 8, "N": 8, "D": 8, "k": 4}) == 16      # tiles 0 and 1 of 8
    assert domain_violations(prog, {"Q": 8, "N": 64, "D": 8, "k": 16}) == []
    assert "k = 17 > 16" in domain_violations(prog, {"Q": 8, "N": 64, "D": 8, "k": 17})[0].message


def test_run_file_refuses_before_running_with_the_formatted_diagnostic(tmp_path):
    path = tmp_path / "pp.cake"
    path.write_text(corpus_file("knn_topk_split_pp.cake").read_text())
    with pytest.raises(CakeError, match=r"pp.cake:83:\d+: error\[domain.extent\].*k = 40 > 16"):
        run_file(path, "knn_topk", [{"Q": 130, "N": 300, "D": 64, "k": 40}])
    (c,) = run_file(path, "knn_topk", [{"Q": 130, "N": 300, "D": 64, "k": 12}])
    assert c.correct, c.message


def test_cake_run_prints_the_refusal_and_exits_1(tmp_path):
    from cake_cli.main import app

    path = tmp_path / "pp.cake"
    path.write_text(corpus_file("knn_topk_split_pp.cake").read_text())
    r = CliRunner().invoke(app, ["run", str(path), "--cpu", "--problem", "knn_topk", "--shape", "Q=64,N=300,D=64,k=40"])
    assert r.exit_code == 1
    assert "domain.extent" in r.output and "k = 40 > 16" in r.output and "Traceback" not in r.output
