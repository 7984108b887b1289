"""The portfolio flow on the CPU: a small portfolio split into regions, one cold evolution run per region on its
representatives (its held-out rows reported apart), the regions' table published; run again, it continues."""
from __future__ import annotations

import pytest

from flows.portfolio import portfolio_flow, portfolio_id_of
from warehouse import Warehouse

pytestmark = pytest.mark.services

ROWS = ["16,16,32", "24,16,40", "16,24,48", "96,96,96", "128,96,112", "112,128,128", "20,20,36", "104,104,104"]
HELD = ["20,20,36", "104,104,104"]


@pytest.fixture(scope="module")
def portfolio(services, tmp_path_factory):
    root = tmp_path_factory.mktemp("pf")
    csv = root / "mine.csv"
    csv.write_text("M,N,K,role\n" + "".join(f"{r},{'held_out' if r in HELD else 'headline'}\n" for r in ROWS))
    args = dict(problem="gemm_bf16", shape_set=str(csv), regions=2, per_region=2, generations=1, population=2,
                seed=3, warehouse_root=str(root / "warehouse"), cache_dir=str(services["home"] / "cache"))
    return args, portfolio_flow(**args)


def test_each_region_is_one_run_on_its_representatives(portfolio):
    args, out = portfolio
    assert out["portfolio_id"] == portfolio_id_of("gemm_bf16", args["shape_set"], 2, 2, 3)
    regions = out["regions"]
    assert [r["region"] for r in regions] == ["region-00", "region-01"]
    assert sum(r["rows"] for r in regions) == 6 and sum(r["held_out"] for r in regions) == 2
    wh = Warehouse(args["warehouse_root"])
    for r in regions:
        (run,) = wh.query("select status, shape_set from runs_latest where run_id = ?", [r["run_id"]]).to_pylist()
        assert run["status"] == "completed" and run["shape_set"].endswith(f"{r['region']}.csv")
        roles = wh.query("select role, count(*) as n from shapes where shape_set = ? group by role",
                         [run["shape_set"]]).to_pylist()
        assert {x["role"]: x["n"] for x in roles}.get("headline") == r["representatives"] == 2
        assert r["best"] and r["score_ms"] > 0


def test_the_planted_groups_are_the_regions_and_held_out_rows_are_never_searched(portfolio):
    args, out = portfolio
    wh = Warehouse(args["warehouse_root"])
    searched = {r["run_id"]: {x["shape"] for x in wh.query(
        "select distinct shape from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'search'", [r["run_id"]]).to_pylist()} for r in out["regions"]}
    small = {s for shapes in searched.values() for s in shapes if int(s.split(",")[0].split("=")[1]) < 64}
    assert any(shapes and shapes <= small for shapes in searched.values()), searched
    assert not any(f"M={h.split(',')[0]}," in s for shapes in searched.values() for s in shapes for h in HELD)


def test_run_again_the_completed_regions_are_kept(portfolio):
    args, out = portfolio
    wh = Warehouse(args["warehouse_root"])
    before = wh.query("select count(*) as n from attempts").to_pylist()[0]["n"]
    again = portfolio_flow(**args)
    assert wh.query("select count(*) as n from attempts").to_pylist()[0]["n"] == before
    assert [r["best"] for r in again["regions"]] == [r["best"] for r in out["regions"]]


def test_each_regions_finalists_are_swept_over_every_other_searched_row(portfolio):
    args, out = portfolio
    wh = Warehouse(args["warehouse_root"])
    searched = {f"M={r.split(',')[0]},N={r.split(',')[1]},K={r.split(',')[2]}" for r in ROWS if r not in HELD}
    for r in out["regions"]:
        reps = {x["shape"] for x in wh.query(
            "select s.shape from shapes s join runs_latest r on r.shape_set = s.shape_set where r.run_id = ? "
            "and s.role = 'headline'", [r["run_id"]]).to_pylist()}
        swept = {x["shape"] for x in wh.query(
            "select distinct c.shape from checks c join attempts a using (attempt_id) where a.run_id = ? "
            "and c.kind = 'sweep'", [r["run_id"]]).to_pylist()}
        assert swept == searched - reps, (r["region"], swept)
        assert r["best"] in {x["attempt_id"] for x in wh.query(
            "select distinct c.attempt_id from checks c join attempts a using (attempt_id) where a.run_id = ? "
            "and c.kind = 'sweep'", [r["run_id"]]).to_pylist()}
