"""Carrying a harness from one warehouse to another: the approved versions, with their proposals and decisions."""
from __future__ import annotations

import json

import pytest
from harness_runs import SOURCE_CHANGES, source_home

from cake_core.errors import CakeError
from tasks.harness import chain_to_json, harness_chain, import_harness_chain, load_harness
from warehouse import Warehouse


def test_a_chain_is_the_version_and_every_version_it_was_built_on(tmp_path):
    root = source_home(tmp_path / "src")
    chain = harness_chain(str(root))
    assert chain["version"] == len(SOURCE_CHANGES) == 3
    assert [(v["version"], v["parent"]) for v in chain["harness_versions"]] == [(1, 0), (2, 1), (3, 2)]
    assert [p["kind"] for p in chain["proposals"]] == [kind for kind, _, _ in SOURCE_CHANGES]
    assert {d["decision"] for d in chain["decisions"]} == {"approved"} and len(chain["decisions"]) == 3
    two = harness_chain(str(root), 2)
    assert two["version"] == 2 and [p["kind"] for p in two["proposals"]] == ["rule", "tactic"]


def test_an_imported_chain_is_the_same_harness_and_keeps_its_record(tmp_path):
    src = source_home(tmp_path / "src")
    chain = json.loads(chain_to_json(harness_chain(str(src))))     # as an experiment keeps it: JSON
    dest = tmp_path / "arm" / "warehouse"
    spec = import_harness_chain(str(dest), chain)
    assert spec.to_json() == load_harness(str(src)).to_json() == load_harness(str(dest), 3).to_json()
    assert [r.id for r in spec.learned_rules] == ["learned.unguarded_store"] and spec.cost_eff == (("simt", 0.4),)
    wh = Warehouse(dest)
    effects = wh.query("select version, kind from harness_effects order by 1").to_pylist()
    assert [(e["version"], e["kind"]) for e in effects] == [(1, "rule"), (2, "tactic"), (3, "calibration")]
    status = {r["status"] for r in wh.query("select status from proposals_latest").to_pylist()}
    assert status == {"approved"}
    assert sorted(p.name for p in (tmp_path / "arm" / "harness").iterdir()) == [f"harness-v{v}.json" for v in (1, 2, 3)]
    # a second import (an experiment continuing) lands nothing
    counts = {t: wh.query(f"select count(*) as n from {t}").to_pylist()[0]["n"]
              for t in ("harness_versions", "proposals", "decisions")}
    import_harness_chain(str(dest), chain)
    assert counts == {t: wh.query(f"select count(*) as n from {t}").to_pylist()[0]["n"] for t in counts} == \
        {"harness_versions": 3, "proposals": 3, "decisions": 3}


def test_a_warehouse_with_versions_of_its_own_takes_no_other_harness(tmp_path):
    chain = harness_chain(str(source_home(tmp_path / "src")))
    other = source_home(tmp_path / "other", changes=SOURCE_CHANGES[1:])
    with pytest.raises(CakeError, match="holds harness versions of its own .1, 2."):
        import_harness_chain(str(other), chain)


def test_a_warehouse_without_an_approved_change_has_no_chain(tmp_path):
    root = source_home(tmp_path / "src", changes=())
    with pytest.raises(CakeError, match="holds no approved harness change .only the built-in v0."):
        harness_chain(str(root))
    root = source_home(tmp_path / "two")
    with pytest.raises(CakeError, match="holds no harness version 7 .it has 0, 1, 2, 3."):
        harness_chain(str(root), 7)
    with pytest.raises(CakeError, match="version 0 is the built-in one"):
        harness_chain(str(root), 0)
