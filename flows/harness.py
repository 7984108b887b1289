"""The harness-review flow: records → proposals → corpus gate → a decision → new versions.

Each proposal is recorded with its evidence and gate report. One the corpus gate refuses is rejected by
the gate, with its refusals as the reason (so it is never proposed again). Each proposal's evidence is an
artifact of the review's flow run, and so is each decision (also logged on the run). The others are
decided by the approval policy the run names (:data:`POLICIES`):

- ``manual`` (the default): the flow run pauses on each (``pause_flow_run`` with a typed ``Decision``
  input: approve or reject, and a reason, both required; the form's description is the proposal's
  evidence and gate report) until a person resumes it from the Prefect UI, or with
  ``cake harness approve ID`` / ``reject ID``, which call :func:`decide_proposal`;
- ``approve-gated``: every proposal the gate passed is approved at once (a program running evolution in
  blocks of generations, with an evolving harness);
- ``record-only``: proposals are recorded and left pending (a frozen harness that still shows what it
  would have learnt).
"""
from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.flow_runs import pause_flow_run
from prefect.runtime import flow_run

from tasks.artifacts import decision_artifact, harness_record_artifact, proposal_artifact, shown
from tasks.harness import (AlreadyDecided, CakeError, Decision, apply_decision, decide_proposal, mine_proposals,
                           record_proposal)

__all__ = ["Decision", "harness_review_flow", "decide_proposal"]

POLICIES = ("manual", "approve-gated", "record-only")


def _decided(log, pid: str, title: str, approve: bool, reason: str, by: str, version: int | None) -> dict:
    """Log a decision on the run and publish it beside the proposal's evidence."""
    word = "approved" if approve else "rejected"
    log.info(f"proposal {pid} {word} by {by}: {reason}" + (f"; harness version {version} created" if version else ""))
    shown(log, f"the decision on {pid}", decision_artifact(pid, title, word, reason, by, version, return_state=True))
    return {"decision": word, "new_version": version, "by": by}


@flow(name="harness-review", flow_run_name="harness review · {policy} · min support {min_support}",
      log_prints=True)
def harness_review_flow(warehouse_root: str = ".cake/warehouse", min_support: int = 3,
                        pause_timeout_s: int = 86400, policy: str = "manual",
                        gpu_cache_dir: str | None = None, pause_poll_s: int = 10) -> list[dict[str, Any]]:
    """Propose harness changes from the warehouse and have each decided under ``policy``; with
    ``gpu_cache_dir`` (a GPU machine) the corpus gate checks the corpus on the GPU too. A paused run asks the
    Prefect API every ``pause_poll_s`` seconds whether it was resumed."""
    if policy not in POLICIES:
        raise CakeError(f"unknown approval policy `{policy}`; use one of {', '.join(POLICIES)}")
    log = get_run_logger()
    shown(log, "the harness's record", harness_record_artifact(warehouse_root, return_state=True))
    mined = mine_proposals(warehouse_root, min_support, gpu_cache_dir)
    for s in mined["skipped"]:
        log.info(f"not proposed ({s.get('signature', '?')}): {s['why']}")
    outcomes = []
    for prop, gate in mined["proposals"]:
        pid = record_proposal(warehouse_root, prop, gate, str(flow_run.id) if flow_run.id else None)
        base = {"proposal_id": pid, "kind": prop.kind}
        if not gate["passed"]:          # decided at once: never left pending while its evidence is published
            reason = "corpus gate: " + "; ".join(gate["refusals"])
            apply_decision(warehouse_root, pid, False, reason, "corpus-gate")
            outcomes.append({**base, **_decided(log, pid, prop.title, False, reason, "corpus-gate", None)})
            shown(log, f"the evidence of {pid}", proposal_artifact(warehouse_root, pid, return_state=True))
            continue
        evidence = shown(log, f"the evidence of {pid}", proposal_artifact(warehouse_root, pid, return_state=True)) \
            or f"# Proposal {pid}: {prop.title}\n\nIts evidence is in `cake harness proposals` (not published here)."
        if policy == "record-only":
            log.info(f"proposal {pid} left pending ({policy}): {prop.title}")
            outcomes.append({**base, "decision": "pending", "by": policy})
            continue
        if policy == "approve-gated":
            reason = "passed the corpus gate"
            version = apply_decision(warehouse_root, pid, True, reason, f"policy:{policy}")
            outcomes.append({**base, **_decided(log, pid, prop.title, True, reason, policy, version),
                             "by": policy})
            continue
        log.info(f"proposal {pid}: {prop.title}; decide in the UI (the paused run's form) or with "
                 f"`cake harness approve {pid} --reason ...` / `cake harness reject {pid} --reason ...`")
        decision = pause_flow_run(wait_for_input=Decision.with_initial_data(description=evidence),
                                  timeout=pause_timeout_s, poll_interval=pause_poll_s, key=pid)
        try:
            version = apply_decision(warehouse_root, pid, decision.approve, decision.reason, decision.decided_by)
        except AlreadyDecided as e:   # decided meanwhile without resuming this run (e.g. from another CLI)
            log.warning(str(e))
            continue
        d = _decided(log, pid, prop.title, decision.approve, decision.reason.strip(), decision.decided_by, version)
        outcomes.append({**base, "decision": d["decision"], "new_version": version})
    return outcomes
