"""`cake coverage`: a portfolio's shapes against the kernels' domains, before anything is compiled: per kernel what
its domain admits, the bounds that refuse the rest, the union, and exit 1 when some shape is unserved. `cake
regions`: the region plan the portfolio flow searches."""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.pipeline.coverage import coverage
from cake_core.problems import get_problem
from cli_run import one_error_line, run
from stand_ins import no_services  # noqa: F401 - fixture


def test_the_kmeans_portfolio_is_served_by_the_hand_written_kernels_past_d_128_by_the_deep_one():
    r = run("coverage", "kmeans_assign", "--shapes", "kmeans_portfolio")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "kmeans_assign_ws.cake │ 46/123 │ 7/18 │ D > 128 (77)" in out
    assert "kmeans_assign_ws_deep.cake │ 123/123 │ 18/18" in out
    assert "any kernel │ 123/123 │ 18/18" in out and "no kernel serves" not in out
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


@pytest.fixture
def fake_flow(monkeypatch, no_services):  # noqa: F811 - the fixture above
    """The portfolio flow replaced by a recorder; the services started by nothing (``no_services``)."""
    import flows.portfolio as flow
    from cake_cli import services

    calls: list[dict] = []

    def portfolio_flow(**kw):
        from tasks.portfolio import portfolio_report

        calls.append(kw)
        return {"portfolio_id": kw["portfolio_id"],
                "report": portfolio_report(kw["warehouse_root"], kw["problem"], kw["shape_set"]), "regions": [
            {"region": "region-00", "run_id": f"{kw['portfolio_id']}-region-00", "rows": 60, "held_out": 9,
             "status": "completed", "best": "0123456789abcdef", "score_ms": 0.0123}]}

    monkeypatch.setattr(flow, "portfolio_flow", portfolio_flow)
    monkeypatch.setattr(services, "prefect_server", no_services_cm(no_services, "prefect"))
    monkeypatch.setattr(services, "ray_runtime", no_services_cm(no_services, "ray"))
    monkeypatch.setattr(services, "gpu_policy", lambda settings: [])
    return calls, no_services


def no_services_cm(used: list, name: str):
    import contextlib

    @contextlib.contextmanager
    def cm(*a, **kw):
        used.append(name)
        yield None
    return cm


def test_cake_portfolio_runs_the_portfolio_flow_with_what_it_was_given(fake_flow):
    calls, used = fake_flow
    r = run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "4", "--per-region", "2",
            "--generations", "1", "--population", "4", "--seed", "5", "--warm")
    assert r.exit_code == 0, r.output
    (kw,) = calls
    assert (kw["problem"], kw["shape_set"], kw["regions"], kw["per_region"], kw["generations"], kw["population"],
            kw["seed"], kw["cold"]) == ("kmeans_assign", "kmeans_portfolio", 4, 2, 1, 4, 5, False)
    assert kw["portfolio_id"].startswith("pf-kmeans_portfolio-") and kw["gpu_models"] == []
    assert used == ["prefect", "ray"]
    out = " ".join(r.stdout.split())
    assert "123 rows, warm, CPU only" in out and "region-00" in out and "0123456789ab" in out and "0.0123" in out
    # the rows against the peer: nothing timed in this home, so every row is unserved and there is no plot
    assert "all: 0/123 rows served, 0 with a peer figure, geomean peer / ours -, 0 below 1x" in out
    assert "held_out: 0/18 rows served" in out and "(no row has both figures: no plot)" in out
    report = out.split("report: ")[1].split()[0].rstrip(",")
    assert report.endswith(f"{kw['portfolio_id']}/portfolio.md")
    assert run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "4", "--per-region", "2",
               "--generations", "1", "--population", "4", "--seed", "5", "--warm").exit_code == 0
    assert calls[1]["portfolio_id"] == kw["portfolio_id"], "the same arguments continue the same portfolio"
    assert run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio").exit_code == 0
    assert calls[2]["cold"] is True, "cold by default"


def test_cake_portfolio_names_the_other_portfolio_of_the_problem_and_set_and_its_options(fake_flow, tmp_path):
    import sys
    from pathlib import Path

    from tasks.portfolio import portfolio_plan
    from warehouse import Warehouse
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "warehouse"))
    from wh_fixtures import dataset

    calls, _ = fake_flow
    assert run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "3").exit_code == 0
    first = calls[0]["portfolio_id"]
    portfolio_plan.fn("kmeans_assign", "kmeans_portfolio", 3, 3, 0, first, calls[0]["warehouse_root"])
    Warehouse(calls[0]["warehouse_root"]).append("runs", [dataset()["runs"][1] | {
        "run_id": f"{first}-region-00", "problem": "kmeans_assign"}])
    r = run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "4")
    assert r.exit_code == 0 and calls[1]["portfolio_id"] != first
    out = " ".join(r.stdout.split())
    assert (f"note: this home also holds portfolio {first} (--regions 3 --per-region 3 --seed 0) of kmeans_assign "
            f"on kmeans_portfolio; these options name {calls[1]['portfolio_id']}") in out
    again = run("portfolio", "kmeans_assign", "--shapes", "kmeans_portfolio", "--regions", "3")
    assert "note:" not in again.stdout, "the portfolio itself is not another one"


def test_cake_portfolio_refuses_bad_input_in_one_line_before_any_service(fake_flow, tmp_path):
    calls, used = fake_flow
    assert "unknown problem `nope`" in one_error_line(run("portfolio", "nope", "--shapes", "x"))
    assert "no shape set `nope`" in one_error_line(run("portfolio", "kmeans_assign", "--shapes", "nope"))
    held = tmp_path / "held.csv"
    held.write_text("B,N,K,D,role\n1,256,64,32,held_out\n2,512,64,32,held_out\n")
    r = run("portfolio", "kmeans_assign", "--shapes", str(held))
    assert r.exit_code == 2 and "every row is held out" in one_error_line(r)
    assert calls == [] and used == []
