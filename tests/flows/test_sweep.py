"""The sweep flow: one evolution run per shape set; a bad set is refused before any run starts."""
import pytest

from cake_core.errors import CakeError
from warehouse import Warehouse

pytestmark = pytest.mark.services


def test_sweep_evolves_each_set(services, tmp_path):
    from flows.sweep import sweep_flow

    own = tmp_path / "mine.csv"
    own.write_text("M,N,K,role\n48,40,24,headline\n33,17,9,tail\n")
    wh_root = str(tmp_path / "warehouse")
    out = sweep_flow(problem="gemm_bf16", shape_sets=["gemm_small", str(own)], generations=1, population=3,
                     warehouse_root=wh_root, cache_dir=str(services["home"] / "cache"))
    assert set(out["runs"]) == {"gemm_small", str(own)}
    runs = Warehouse(wh_root).query("select shape_set, agent, status from runs_latest").to_pylist()
    assert sorted(runs, key=str) == sorted([{"shape_set": "gemm_small", "agent": "tactic", "status": "completed"},
                                            {"shape_set": str(own), "agent": "tactic", "status": "completed"}],
                                           key=str)
    attempts = Warehouse(wh_root).query("select count(*) as n from attempts").to_pylist()[0]["n"]
    assert attempts == sum(r["attempts"] for r in out["runs"].values()) > 0


def test_a_bad_shape_set_is_refused_before_any_run(services, tmp_path):
    from flows.sweep import sweep_flow

    with pytest.raises(CakeError, match="nope"):
        sweep_flow(problem="gemm_bf16", shape_sets=["gemm_small", "nope"], warehouse_root=str(tmp_path / "w"))
    assert not (tmp_path / "w").exists() or not Warehouse(tmp_path / "w").query(
        "select * from runs").to_pylist()
