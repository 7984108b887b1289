"""`cake coverage`: a portfolio's shapes against the kernels' domains, before anything is compiled: per kernel what
its domain admits, the bounds that refuse the rest, the union, and exit 1 when some shape is unserved. `cake
regions`: the region plan the portfolio flow searches."""
from __future__ import annotations

from cake_core.ir.text import parse_program
from cake_core.pipeline.coverage import coverage
from cake_core.problems import get_problem
from cli_run import one_error_line, run


def test_the_kmeans_portfolio_is_served_where_d_fits_the_hand_written_kernels():
    r = run("coverage", "kmeans_assign", "--shapes", "kmeans_portfolio")
    assert r.exit_code == 1, r.output
    out = " ".join(r.stdout.split())
    assert "kmeans_assign_ws.cake │ 46/123 │ 7/18 │ D > 128 (77)" in out
    assert "any kernel │ 46/123 │ 7/18" in out and "77 shapes no kernel serves (first 12)" in out
    assert "kmeans_assign.cake " not in out, "the naive seed is counted only with --seed"


def test_with_the_seed_every_kmeans_row_is_served_and_the_exit_is_0():
    r = run("coverage", "kmeans_assign", "--shapes", "kmeans_portfolio", "--seed")
    assert r.exit_code == 0, r.output
    assert "any kernel │ 123/123 │ 18/18" in " ".join(r.stdout.split())


def test_given_kernel_files_are_judged_instead(tmp_path):
    p = get_problem("knn_topk")
    f = tmp_path / "mine.cake"
    f.write_text(p.seed_text())
    r = run("coverage", "knn_topk", "--shapes", "knn_build_portfolio", "--kernel", str(f))
    assert r.exit_code == 1 and "mine.cake │ 72/109" in " ".join(r.stdout.split()) and "k > 16 (37)" in r.stdout
    f.write_text("@kernel(\n")
    r = run("coverage", "knn_topk", "--shapes", "knn_build_portfolio", "--kernel", str(f))
    assert r.exit_code == 2 and "does not parse" in one_error_line(r) and "mine.cake:" in one_error_line(r)


def test_bad_input_is_one_line():
    assert "unknown problem `nope`" in one_error_line(run("coverage", "nope", "--shapes", "x"))
    assert "no shape set `nope`" in one_error_line(run("coverage", "tinygemm", "--shapes", "nope"))
    r = run("coverage", "tinygemm", "--shapes", "gemm_decode_portfolio", "--kernel", "/nonexistent.cake")
    assert r.exit_code == 2 and "no such file" in one_error_line(r)


def test_a_shape_outside_the_problem_is_named_and_served_by_none():
    p = get_problem("knn_topk")
    seed = parse_program(p.seed_text(), "seed")
    shapes = [{"Q": 4, "N": 8, "D": 16, "k": 4}, {"Q": 4, "N": 3, "D": 16, "k": 4}, {"Q": 4, "N": 64, "D": 16, "k": 40}]
    cov = coverage(p, shapes, ["headline"] * 3, {"seed": seed})
    assert cov.admitted["seed"] == [True, False, False] and cov.covered() == [True, False, False]
    assert "k = 4 > N = 3" in cov.invalid["Q=4,N=3,D=16,k=4"]
    assert cov.refusals["seed"] == {"k > 16": 1} and cov.uncovered() == shapes[1:]


def test_cake_regions_prints_the_plan_the_portfolio_flow_searches():
    r = run("regions", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "4", "--per-region", "2")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "kmeans_portfolio: 123 rows in 4 regions" in out and "region-03" in out and "region-04" not in out
    assert out.count("B=") == 8, "two representatives per region"


def test_cake_regions_refuses_a_set_with_nothing_to_search(tmp_path):
    f = tmp_path / "held.csv"
    f.write_text("M,N,K,role\n16,16,16,held_out\n")
    assert "every row is held out" in one_error_line(run("regions", "tinygemm", "--shapes", str(f)))
