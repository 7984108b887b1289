"""A small, coherent warehouse fixture: 2 runs, 3 generations, every table populated."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

T0 = datetime(2026, 11, 27, 12, 0, 0)
SHAPES = ["M=128,N=96,K=64", "M=4096,N=4096,K=64"]
FAILURES = [  # (stage, outcome, rule, signature)
    ("verify", "verify_failed", "smem_overflow", "verify:smem_overflow"),
    ("verify", "verify_failed", "race_wgmma_read", "verify:race_wgmma_read"),
    ("compile", "compile_failed", None, "compile:ptxas_register_limit"),
    ("check", "wrong", None, "check:wrong:tail_shape"),
]


def attempt(i: int, run_id: str = "run-a", generation: int = 0, outcome: str = "measured",
            stage: str = "time", rule: str | None = None, signature: str | None = None,
            created_at: datetime | None = None) -> dict:
    return dict(
        attempt_id=f"{run_id}-att-{i}", run_id=run_id, generation=generation, problem="kmeans_assign",
        ir_hash=f"h{i:06d}", ir_text=f"kernel k{i} {{ }}", parents=[f"{run_id}-att-{i - 1}"] if i else [],
        agent="tactic", tactic="tile_m" if i % 2 else None, harness_version=1, stage=stage, outcome=outcome,
        error_rule=rule, error_message=f"failed: {rule}" if rule else None, signature=signature,
        features=json.dumps({"smem_bytes": 1024 * i, "stages": 2}), prompt_tokens=100, completion_tokens=50,
        predicted_ms=0.5 + 0.01 * i, gpu_seconds=0.25, created_at=created_at or T0 + timedelta(minutes=i),
    )


def measurement(attempt_id: str, run_id: str, shape: str, median: float, correct: bool = True,
                kind: str = "search") -> dict:
    return dict(attempt_id=attempt_id, run_id=run_id, shape=shape, gpu_model="H200", timer="cuda_event",
                l2="cold", median_ms=median, p10_ms=median * 0.95, p90_ms=median * 1.1, runs=20,
                correct=correct, max_error=1e-6 if correct else 0.5, kind=kind,
                measured_at=T0 + timedelta(hours=1))


def dataset() -> dict[str, list[dict]]:
    """Rows for every table; values chosen so each view has a known answer (see test_views)."""
    runs = []
    for r, (run_id, shape_set) in enumerate([("run-a", "kmeans_portfolio"), ("run-b", "kmeans_portfolio")]):
        base = dict(run_id=run_id, problem="kmeans_assign", shape_set=shape_set, harness_version=1,
                    agent="tactic", seed=r, generations=3, population=4, host="ws1", gpu_model="H200",
                    flow_run_id=f"flow-{r}", started_at=T0)
        runs.append(base | dict(status="running", recorded_at=T0))
        runs.append(base | dict(status="completed", finished_at=T0 + timedelta(hours=2),
                                recorded_at=T0 + timedelta(hours=2)))
    attempts, measurements, diagnostics, compiles, predictions, checks = [], [], [], [], [], []
    i = 0
    for run_id in ("run-a", "run-b"):
        for gen in range(3):
            for stage, outcome, rule, sig in FAILURES:
                attempts.append(attempt(i, run_id, gen, outcome, stage, rule, sig,
                                        created_at=T0 + timedelta(days=gen, minutes=i)))
                if stage == "verify":
                    diagnostics.append(dict(attempt_id=attempts[-1]["attempt_id"], rule=rule, severity="error",
                                            message=f"{rule} at line 3", line=3, col=7, path="body/0",
                                            hint="reduce tile", witness=["op 3", "op 5"]))
                i += 1
            # one winner per generation, getting faster with the generation
            a = attempt(i, run_id, gen, created_at=T0 + timedelta(days=gen, minutes=i))
            attempts.append(a)
            diagnostics.append(dict(attempt_id=a["attempt_id"], rule="unused_smem", severity="warning",
                                    message="smem buffer never read", line=None, col=None, path=None,
                                    hint=None, witness=None))
            compiles.append(dict(attempt_id=a["attempt_id"], source_hash=f"s{i}", arch="sm_90a", seconds=1.5,
                                 registers=128, spill_bytes=0, smem_bytes=49152, barriers=2, cached=False,
                                 ok=True, log=""))
            for s, shape in enumerate(SHAPES):
                median = (1.0 + s) / (gen + 1) + (0.01 if run_id == "run-b" else 0.0)
                measurements.append(measurement(a["attempt_id"], run_id, shape, median))
                predictions.append(dict(attempt_id=a["attempt_id"], model_version="analytic-1", shape=shape,
                                        predicted_ms=median * 2))
                checks.append(dict(attempt_id=a["attempt_id"], shape=shape, backend="interpreter",
                                   correct=True, max_error=1e-7, message=None))
            i += 1
    # a fast but wrong measurement must not top the leaderboard
    measurements.append(measurement("run-a-att-0", "run-a", SHAPES[0], 0.001, correct=False))
    shapes = [dict(shape_set="kmeans_portfolio", problem="kmeans_assign", shape=s,
                   dims=json.dumps(dict(kv.split("=") for kv in s.split(","))), role=role)
              for s, role in zip(SHAPES, ["headline", "tail"])]
    proposals = [dict(proposal_id=f"prop-{k}", kind="rule", signature="verify:smem_overflow",
                      title=f"rule {k}", evidence="{}", payload="{}", gate_report=None, flow_run_id=None,
                      base_version=1, created_at=T0, recorded_at=T0) for k in range(3)]
    proposals.append(proposals[0] | dict(gate_report='{"ok": true}', recorded_at=T0 + timedelta(hours=1)))
    decisions = [
        dict(proposal_id="prop-0", decision="rejected", reason="too broad", decided_by="ana",
             decided_at=T0 + timedelta(hours=2), new_version=None),
        dict(proposal_id="prop-0", decision="approved", reason="narrowed", decided_by="ana",
             decided_at=T0 + timedelta(hours=3), new_version=2),
        dict(proposal_id="prop-1", decision="rejected", reason="gate regressed", decided_by="bo",
             decided_at=T0 + timedelta(hours=3), new_version=None),
    ]
    harness_versions = [dict(version=1, parent=None, proposal_id=None, spec="{}", created_at=T0),
                        dict(version=2, parent=1, proposal_id="prop-0", spec='{"rules": ["smem"]}',
                             created_at=T0 + timedelta(hours=3))]
    dispatch = [dict(problem="kmeans_assign", shape_set="kmeans_portfolio", shape=s, attempt_id="run-a-att-14",
                     ir_hash="h000014", median_ms=0.5, created_at=T0) for s in SHAPES]
    stage_times = [dict(run_id="run-a", session=0, generation=g, stage=st, wall_s=0.5, work_s=1.0, n_in=5,
                        n_out=4, workers=2, recorded_at=T0 + timedelta(days=g))
                   for g in range(3) for st in ("verify", "compile", "time")]
    baselines = [dict(run_id="run-a", name="kmeans_assign_ws.cake", source="hand_written", shape=s, role="headline",
                      gpu_model="H200", timer="cuda_event", l2="cold-clean", median_ms=0.3, p10_ms=0.29,
                      p90_ms=0.31, runs=20, predicted_ms=0.2, correct=True, message=None,
                      measured_at=T0 + timedelta(hours=2)) for s in SHAPES]
    model_versions = [dict(version="learned-1+n40", kind="learned", gpu="H200", target="sm_90a", path="m.json",
                           split="run", trained_on='{"samples": 40}', evaluation='{"overall": {}}',
                           beats_analytic=False, created_at=T0)]
    return dict(runs=runs, attempts=attempts, diagnostics=diagnostics, compiles=compiles,
                predictions=predictions, checks=checks, measurements=measurements, shapes=shapes,
                proposals=proposals, decisions=decisions, harness_versions=harness_versions, dispatch=dispatch,
                stage_times=stage_times, baselines=baselines, model_versions=model_versions,
                tactic_refusals=[dict(run_id="run-a", generation=1, tactic="tma", parent_hash="h000001",
                                      reason="no cp_async_bar copies to turn into TMA", recorded_at=T0)],
                reruns=[dict(run_id="run-a", session=0, generation=1, kind="search", attempt_id="run-a-att-3",
                             shape=SHAPES[0], cause="died", node_id="n1", pid=4242,
                             message="worker died: the actor died unexpectedly", recorded_at=T0)])
