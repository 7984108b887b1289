"""The harness-review flow: clusters → proposals → corpus gate → pause for a person → new version.

Each proposal that passes the corpus gate pauses the flow run
(``pause_flow_run`` with a typed ``Decision`` input): a person resumes it from
the Prefect UI, or with ``cake harness approve ID`` / ``reject ID``, which
call :func:`decide_proposal`. A proposal that fails the gate is rejected by
the flow with the gate's report as the reason.
"""
from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run

from tasks.harness import AlreadyDecided, apply_decision, decide_proposal, mine_proposals, record_proposal

__all__ = ["Decision", "harness_review_flow", "decide_proposal"]


class Decision(RunInput):
    """What a reviewer answers to a paused proposal."""

    approve: bool
    reason: str = ""
    decided_by: str = "prefect-ui"


@flow(name="harness-review", log_prints=True)
def harness_review_flow(warehouse_root: str = ".cake/warehouse", min_support: int = 3,
                        pause_timeout_s: int = 86400) -> list[dict[str, Any]]:
    """Propose harness changes from recurring failures and wait for a person on each."""
    log = get_run_logger()
    outcomes = []
    for prop, gate in mine_proposals(warehouse_root, min_support):
        pid = record_proposal(warehouse_root, prop, gate, str(flow_run.id) if flow_run.id else None)
        if not gate["passed"]:
            apply_decision(warehouse_root, pid, False, f"corpus gate failed: would break {gate['newly_failing']}",
                           "corpus-gate")
            outcomes.append({"proposal_id": pid, "decision": "rejected", "by": "corpus-gate"})
            continue
        log.info(f"proposal {pid}: {prop.title} — would have caught {gate['caught']}/{gate['cluster_size']} "
                 f"failures; approve with `cake harness approve {pid}` or in the UI")
        decision = pause_flow_run(wait_for_input=Decision, timeout=pause_timeout_s, key=pid)
        try:
            version = apply_decision(warehouse_root, pid, decision.approve, decision.reason, decision.decided_by)
        except AlreadyDecided as e:   # decided meanwhile without resuming this run (e.g. from another CLI)
            log.warning(str(e))
            continue
        outcomes.append({"proposal_id": pid, "decision": "approved" if decision.approve else "rejected",
                         "new_version": version})
    return outcomes
