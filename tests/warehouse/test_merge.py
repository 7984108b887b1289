"""`cake harness import-runs`: another home's run batches copied into this warehouse (only what is new; compacted
batches with their records, so nothing is counted twice), the harness tables left where they were made, a source
whose runs ran under a learned harness refused, and bad sources named in one line."""
from __future__ import annotations

import pytest

from warehouse import Warehouse
from warehouse.errors import WarehouseError
from warehouse.merge import import_runs
from wh_fixtures import attempt


def home_with(tmp_path, name: str, run_id: str, n: int, harness_version: int = 0) -> Warehouse:
    wh = Warehouse(tmp_path / name / "warehouse")
    for i in range(n):
        wh.append("attempts", [attempt(i, run_id) | {"harness_version": harness_version}])
    return wh


def count(wh: Warehouse, run_id: str) -> int:
    return wh.query("select count(*) as n from attempts where run_id = ?", [run_id]).to_pylist()[0]["n"]


def test_the_other_homes_runs_land_here_once_and_its_harness_stays_there(tmp_path):
    here = home_with(tmp_path, "here", "run-here", 2)
    there = home_with(tmp_path, "there", "run-there", 3)
    there.append("harness_versions", [{"version": 1, "parent": 0, "proposal_id": "p1", "spec": "{}"}])
    copied = import_runs(here, tmp_path / "there")            # a home: its warehouse is found under it
    assert copied["attempts"] == 3 and "harness_versions" not in copied
    assert count(here, "run-there") == 3 and count(here, "run-here") == 2
    assert here.query("select count(*) as n from harness_versions").to_pylist()[0]["n"] == 0
    assert sum(import_runs(here, there.root).values()) == 0, "a second import copies nothing"
    assert count(here, "run-there") == 3


def test_a_batch_compacted_after_an_import_is_not_counted_twice(tmp_path):
    here = home_with(tmp_path, "here", "run-here", 1)
    there = home_with(tmp_path, "there", "run-there", 3)
    import_runs(here, there.root)
    there.append("attempts", [attempt(7, "run-there") | {"harness_version": 0}])
    assert there.compact("attempts", grace_s=0) > 0
    copied = import_runs(here, there.root)
    assert copied["attempts"] == 1, "only the compacted batch is new"
    assert count(here, "run-there") == 4, "its record hides the three inputs imported before"


def test_runs_under_a_learned_harness_are_refused_with_their_names(tmp_path):
    here = home_with(tmp_path, "here", "run-here", 1)
    there = home_with(tmp_path, "there", "run-learned", 2, harness_version=2)
    with pytest.raises(WarehouseError, match=r"1 run\(s\) ran under a learned harness .*run-learned \(v2\)"):
        import_runs(here, there.root)
    assert count(here, "run-learned") == 0


def test_bad_sources_are_named(tmp_path):
    here = home_with(tmp_path, "here", "run-here", 1)
    with pytest.raises(WarehouseError, match="not a Cake home or warehouse"):
        import_runs(here, tmp_path / "nowhere")
    with pytest.raises(WarehouseError, match="this home's own warehouse"):
        import_runs(here, here.root)
    newer = home_with(tmp_path, "newer", "run-x", 1)
    (newer.root / "SCHEMA_VERSION").write_text(f"{newer.schema.version + 1}\n")
    with pytest.raises(WarehouseError, match="newer than this Cake's"):
        import_runs(here, newer.root)
