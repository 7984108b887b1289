"""harness_effects: what each approved harness change did from its version on, across every run of the warehouse:
the candidates a rule stopped and the GPU-seconds that saved, the attempts and winners that used a primitive or a
macro, the attempts a calibration ranked."""
from __future__ import annotations

import json
from datetime import timedelta

from wh_fixtures import T0, attempt, dataset

from warehouse import Warehouse


def _approved(pid: str, kind: str, version: int, payload: dict, signature: str = "", evidence: dict | None = None):
    at = T0 + timedelta(days=5, hours=version)
    return ([dict(proposal_id=pid, kind=kind, signature=signature, title=f"{kind} {pid}", evidence=json.dumps(evidence or {}),
                  payload=json.dumps(payload), gate_report='{"ok": true}', flow_run_id=None, base_version=version - 1,
                  created_at=at, recorded_at=at)],
            [dict(proposal_id=pid, decision="approved", reason="gated", decided_by="ana", decided_at=at,
                  new_version=version)],
            [dict(version=version, parent=version - 1, proposal_id=pid, spec="{}", created_at=at)])


def _warehouse(tmp_path, folder: str = "wh") -> Warehouse:
    data = dataset()
    changes = [_approved("p-rule", "rule", 3, {"id": "learned.tail_tile", "predicate": {}}, "check:wrong:tail_shape"),
               _approved("p-macro", "tactic", 4, {"macro": {"name": "ws_tma", "steps": ["warp_specialize", "tma"]}}),
               _approved("p-prim", "primitive", 5, {"composite": {"name": "gemm_tile"}}),
               _approved("p-cal", "calibration", 6, {"eff": {"mma": 0.8}}, "cost_model",
                         {"judged_on_held_out": {"predictions_changed": 7}})]
    for props, decs, vers in changes:
        data["proposals"] += props
        data["decisions"] += decs
        data["harness_versions"] += vers
    later = T0 + timedelta(days=6)
    extra = []
    # four candidates the rule stopped at verify, under the rule's version and a later one
    for i, v in enumerate((3, 3, 4, 6)):
        a = attempt(900 + i, "run-c", 0, "verify_failed", "verify", "learned.tail_tile", "verify:learned.tail_tile",
                    created_at=later)
        extra.append(a | dict(harness_version=v))
    # the macro in the lineage of run-a's best (gen 2's winner) and of two failures
    for a in data["attempts"]:
        if a["attempt_id"] == "run-a-att-14":
            a.update(harness_version=4, lineage=["warp_specialize+tma", "ws_tma+retile"])
    for i in range(2):
        extra.append(attempt(910 + i, "run-c", 1, "wrong", "check", created_at=later)
                     | dict(harness_version=4, lineage=["ws_tma"]))
    # a look-alike name is not the macro
    extra.append(attempt(915, "run-c", 1, "wrong", "check", created_at=later) | dict(harness_version=4,
                                                                                      lineage=["ws_tma_v2"]))
    # two attempts calling the composite, none a run's best; one ranked under the calibration
    for i in range(2):
        extra.append(attempt(920 + i, "run-c", 2, "wrong", "check", created_at=later)
                     | dict(harness_version=5, ir_text="y = gemm_tile(a_s, b_s)"))
    extra.append(attempt(930, "run-c", 3, "wrong", "check", created_at=later) | dict(harness_version=6))
    data["attempts"] += extra
    wh = Warehouse(tmp_path / folder)
    for table, rows in data.items():
        wh.append(table, rows)
    return wh


def test_each_approved_change_has_its_record(tmp_path):
    wh = _warehouse(tmp_path)
    rows = {r["version"]: r for r in wh.query("select * from harness_effects").to_pylist()}
    assert set(rows) == {2, 3, 4, 5, 6}
    rule = rows[3]
    assert (rule["kind"], rule["name"], rule["stopped"]) == ("rule", "learned.tail_tile", 4)
    # the rule's cluster failed on the GPU six times before it, at 0.25 GPU-s each
    assert rule["gpu_s_saved"] == 4 * 0.25
    macro = rows[4]
    assert (macro["kind"], macro["name"], macro["used"], macro["winners"]) == ("tactic", "ws_tma", 3, 1)
    prim = rows[5]
    assert (prim["name"], prim["used"], prim["winners"]) == ("gemm_tile", 2, 0)
    cal = rows[6]
    assert (cal["ranked"], cal["predictions_changed"]) == (2, 7)     # 930 and the stopped one under v6 had predictions
    assert rows[2]["stopped"] == 0 and rows[2]["gpu_s_saved"] == 0.0      # a rule whose id no attempt carries


def test_a_rule_whose_cluster_never_reached_the_gpu_saved_nothing_measurable(tmp_path):
    wh = _warehouse(tmp_path)
    (row,) = wh.query("select stopped, gpu_s_saved from harness_effects where version = 2").to_pylist()
    assert row == {"stopped": 0, "gpu_s_saved": 0.0}


def test_a_rule_carried_to_a_fresh_warehouse_is_credited_with_its_clusters_cost_where_it_was_mined(tmp_path):
    """A transfer run's warehouse holds none of the rule's failures: the estimate falls back to the cluster's cost
    in the proposal's evidence (GPU-seconds over its attempts where it was mined); the warehouse's own cost wins."""
    wh = Warehouse(tmp_path / "fresh")
    props, decs, vers = _approved("p-carried", "rule", 1, {"id": "learned.guard"}, "time:wrong:check.mismatch",
                                  {"cluster": {"gpu_seconds": 15.0, "n_attempts": 24}})
    wh.append("proposals", props)
    wh.append("decisions", decs)
    wh.append("harness_versions", vers)
    wh.append("attempts", [attempt(i, "run-t", 0, "verify_failed", "verify", "learned.guard", "verify:learned.guard")
                           | dict(harness_version=1) for i in range(3)])
    (row,) = wh.query("select stopped, gpu_s_saved from harness_effects").to_pylist()
    assert row["stopped"] == 3 and abs(row["gpu_s_saved"] - 3 * 15.0 / 24) < 1e-9
    # once the warehouse has its own timed failures of the cluster (before the rule), those are the estimate
    wh.append("attempts", [attempt(50, "run-t", 0, "wrong", "check", None, "time:wrong:check.mismatch")
                           | dict(harness_version=0, gpu_seconds=2.0)])
    (row,) = wh.query("select gpu_s_saved from harness_effects").to_pylist()
    assert row["gpu_s_saved"] == 3 * 2.0


def test_cake_harness_versions_shows_the_record(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cake_cli.main import app

    home = tmp_path / "home"
    _warehouse(home, "warehouse")
    monkeypatch.setenv("CAKE_HOME", str(home))
    result = CliRunner().invoke(app, ["harness", "versions"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    for words in ("learned.tail_tile", "ws_tma", "gemm_tile", "calibration", "stopped", "gpu_s_saved", "winners"):
        assert words in result.output, result.output
