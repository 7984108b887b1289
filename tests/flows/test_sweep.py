"""The sweep flow: evolve over several shape sets, re-time the best kernels, refuse what it cannot do."""
import pytest

from cake_core.errors import CakeError
from warehouse import Warehouse

pytestmark = pytest.mark.services


def test_sweep_evolves_each_set_then_retimes_the_best_kernels(services, tmp_path):
    from flows.sweep import sweep_flow

    own = tmp_path / "mine.csv"
    own.write_text("M,N,K,role\n48,40,24,headline\n33,17,9,tail\n")
    wh_root = str(tmp_path / "warehouse")
    common = dict(problem="gemm_bf16", shape_sets=["gemm_small", str(own)], warehouse_root=wh_root,
                  cache_dir=str(services["home"] / "cache"))
    evolved = sweep_flow(mode="evolve", generations=1, population=3, **common)
    assert evolved["mode"] == "evolve" and set(evolved["runs"]) == {"gemm_small", str(own)}
    wh = Warehouse(wh_root)
    runs = wh.query("select shape_set, agent, status from runs_latest").to_pylist()
    assert sorted(runs, key=str) == sorted([{"shape_set": "gemm_small", "agent": "tactic", "status": "completed"},
                                            {"shape_set": str(own), "agent": "tactic", "status": "completed"}],
                                           key=str)

    best = {r["ir_hash"] for r in wh.query(
        "select ir_hash from attempts where agent = 'tactic' and outcome = 'checked'").to_pylist()}
    assert best
    retimed = sweep_flow(mode="retime", top=2, **common)
    kernels = min(2, len(best))                     # distinct kernels: the seeded agent repeats itself
    for name, r in retimed["runs"].items():
        assert r["kernels"] == kernels and not r["timed"] and sum(r["outcomes"].values()) == kernels, (name, r)
    rows = wh.query("select a.attempt_id, a.parents[1] as parent, r.shape_set from attempts a "
                    "join runs_latest r using (run_id) where a.agent = 'retime'").to_pylist()
    assert len(rows) == 2 * kernels and {r["shape_set"] for r in rows} == {"gemm_small", str(own)}
    assert {r["parent"] for r in rows} <= best      # each re-times a kernel that passed before
    checks = wh.query("select count(*) as n from checks c join attempts a using (attempt_id) "
                      "where a.agent = 'retime'").to_pylist()[0]["n"]
    assert checks >= 2 * kernels                    # checked again on the sets' shapes


def test_sweep_refuses_an_unknown_mode_and_an_empty_warehouse(services, tmp_path):
    from flows.sweep import retime_flow, sweep_flow

    with pytest.raises(CakeError, match="sweep mode `fastest` is not known"):
        sweep_flow(problem="gemm_bf16", mode="fastest", warehouse_root=str(tmp_path / "w"))
    with pytest.raises(CakeError, match="holds no kernel of gemm_bf16 that passed its checks"):
        retime_flow(problem="gemm_bf16", shape_set="gemm_small", warehouse_root=str(tmp_path / "w"))
