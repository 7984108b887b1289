"""The harness-review flow: records → proposals → corpus gate → a decision → new versions.

Each proposal is recorded with its evidence and gate report. One the corpus gate refuses is rejected by
the gate, with its refusals as the reason (so it is never proposed again). The others are decided by the
approval policy the run names (:data:`POLICIES`):

- ``manual`` (the default): the flow run pauses on each (``pause_flow_run`` with a typed ``Decision``
  input) until a person resumes it from the Prefect UI, or with ``cake harness approve ID`` /
  ``reject ID``, which call :func:`decide_proposal`;
- ``approve-gated``: every proposal the gate passed is approved at once (a program running evolution in
  blocks of generations, with an evolving harness);
- ``record-only``: proposals are recorded and left pending (a frozen harness that still shows what it
  would have learnt).
"""
from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run

from tasks.harness import AlreadyDecided, apply_decision, decide_proposal, mine_proposals, record_proposal

__all__ = ["Decision", "harness_review_flow", "decide_proposal"]

POLICIES = ("manual", "approve-gated", "record-only")


class Decision(RunInput):
    """What a reviewer answers to a paused proposal."""

    approve: bool
    reason: str = ""
    decided_by: str = "prefect-ui"


@flow(name="harness-review", log_prints=True)
def harness_review_flow(warehouse_root: str = ".cake/warehouse", min_support: int = 3,
                        pause_timeout_s: int = 86400, policy: str = "manual",
                        gpu_cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Propose harness changes from the warehouse and have each decided under ``policy``; with
    ``gpu_cache_dir`` (a GPU machine) the corpus gate checks the corpus on the GPU too."""
    if policy not in POLICIES:
        raise CakeError(f"unknown approval policy `{policy}`; use one of {', '.join(POLICIES)}")
    log = get_run_logger()
    mined = mine_proposals(warehouse_root, min_support, gpu_cache_dir)
    for s in mined["skipped"]:
        log.info(f"not proposed ({s.get('signature', '?')}): {s['why']}")
    outcomes = []
    for prop, gate in mined["proposals"]:
        pid = record_proposal(warehouse_root, prop, gate, str(flow_run.id) if flow_run.id else None)
        if not gate["passed"]:
            apply_decision(warehouse_root, pid, False, "corpus gate: " + "; ".join(gate["refusals"]), "corpus-gate")
            outcomes.append({"proposal_id": pid, "kind": prop.kind, "decision": "rejected", "by": "corpus-gate"})
            continue
        if policy == "record-only":
            outcomes.append({"proposal_id": pid, "kind": prop.kind, "decision": "pending", "by": policy})
            continue
        if policy == "approve-gated":
            version = apply_decision(warehouse_root, pid, True, "passed the corpus gate", f"policy:{policy}")
            outcomes.append({"proposal_id": pid, "kind": prop.kind, "decision": "approved", "new_version": version,
                             "by": policy})
            continue
        log.info(f"proposal {pid}: {prop.title}; approve with `cake harness approve {pid}` or in the UI")
        decision = pause_flow_run(wait_for_input=Decision, timeout=pause_timeout_s, key=pid)
        try:
            version = apply_decision(warehouse_root, pid, decision.approve, decision.reason, decision.decided_by)
        except AlreadyDecided as e:   # decided meanwhile without resuming this run (e.g. from another CLI)
            log.warning(str(e))
            continue
        outcomes.append({"proposal_id": pid, "kind": prop.kind,
                         "decision": "approved" if decision.approve else "rejected", "new_version": version})
    return outcomes
