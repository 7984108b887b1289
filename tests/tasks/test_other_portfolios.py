"""`cake portfolio` names the other portfolios of the same problem and set that a home holds, with the options that
continue each: a portfolio's id comes from its options, so another --regions starts a new one."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "warehouse"))
from wh_fixtures import dataset  # noqa: E402

from tasks.portfolio import PLAN_FILE, other_portfolios, portfolio_folder, portfolio_plan  # noqa: E402
from warehouse import Warehouse  # noqa: E402


def _runs(root: Path, problem: str, *run_ids: str) -> None:
    row = dataset()["runs"][1]
    Warehouse(root).append("runs", [row | {"run_id": r, "problem": problem} for r in run_ids])


def test_the_plan_records_the_options_and_other_portfolios_are_named_with_theirs(tmp_path):
    root = str(tmp_path / "warehouse")
    portfolio_plan.fn("kmeans_assign", "kmeans_portfolio", 3, 2, 7, "pf-kmeans_portfolio-aaaa", root)
    assert json.loads((portfolio_folder(root, "pf-kmeans_portfolio-aaaa") / PLAN_FILE).read_text()) == {
        "problem": "kmeans_assign", "shape_set": "kmeans_portfolio", "regions": 3, "per_region": 2, "seed": 7}
    legacy = portfolio_folder(root, "pf-kmeans_portfolio-bbbb")       # written before plans were recorded
    legacy.mkdir(parents=True)
    for i in range(4):
        (legacy / f"region-0{i}.csv").write_text("B,N,K,D,role\n")
    _runs(tmp_path / "warehouse", "kmeans_assign", "pf-kmeans_portfolio-aaaa-region-00",
          "pf-kmeans_portfolio-aaaa-region-01", "pf-kmeans_portfolio-bbbb-region-00", "pf-kmeans_portfolio-cccc-region-00")
    _runs(tmp_path / "warehouse", "kmeans_update", "pf-kmeans_portfolio-dddd-region-00")     # another problem
    got = other_portfolios(root, "kmeans_assign", "kmeans_portfolio", "pf-kmeans_portfolio-cccc")
    assert got == ["pf-kmeans_portfolio-aaaa (--regions 3 --per-region 2 --seed 7)",
                   "pf-kmeans_portfolio-bbbb (--regions 4 (its --per-region and --seed not recorded))"]
    assert other_portfolios(root, "kmeans_assign", "kmeans_assign_small", "pf-x") == []       # another set
    assert other_portfolios(str(tmp_path / "none"), "kmeans_assign", "kmeans_portfolio", "pf-x") == []
