"""Harness tasks: the current version, failure clusters, proposals and decisions, in the warehouse."""
from __future__ import annotations

import contextlib
import fcntl
import json
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.flow_runs import resume_flow_run

from cake_core.errors import CakeError
from cake_core.harness.gate import corpus_gate
from cake_core.harness.miners import Proposal, mine_calibration, mine_rule
from cake_core.harness.version import HarnessSpec
from cake_core.model.cost import CostModel
from cake_core.problems import list_problems
from cake_core.pipeline.rows import now
from warehouse import Warehouse


class AlreadyDecided(CakeError):
    """The proposal was approved or rejected already (by the UI, the CLI or the corpus gate)."""


def load_harness(warehouse_root: str, version: int | None = None) -> HarnessSpec:
    """Harness version ``version`` (None: the newest approved; version 0 is the built-in one).

    Raises
    ------
    CakeError
        ``version`` is not in the warehouse.
    """
    wh = Warehouse(warehouse_root)
    if version is None:
        rows = wh.query("select spec from harness_versions order by version desc limit 1").to_pylist()
        return HarnessSpec.from_json(rows[0]["spec"]) if rows else HarnessSpec()
    if version == 0:
        return HarnessSpec()
    rows = wh.query("select spec from harness_versions where version = ? limit 1", [version]).to_pylist()
    if not rows:
        have = [r["version"] for r in wh.query("select distinct version from harness_versions order by 1").to_pylist()]
        raise CakeError(f"harness version {version} does not exist in {warehouse_root} (it has "
                        f"{', '.join(map(str, [0, *have]))}); `cake harness versions` lists them")
    return HarnessSpec.from_json(rows[0]["spec"])


def export_dir(warehouse_root: str) -> Path:
    return Path(warehouse_root).parent / "harness"


@task(name="mine-proposals", cache_policy=NO_CACHE)
def mine_proposals(warehouse_root: str, min_support: int) -> list[tuple[Proposal, dict[str, Any]]]:
    """Clusters of recurring failures that no proposal has addressed yet → proposals + gate reports."""
    wh = Warehouse(warehouse_root)
    current = load_harness(warehouse_root)
    seen = {r["signature"] for r in wh.query(
        "select signature from proposals where base_version = ?", [current.version]).to_pylist()}
    clusters = wh.query("select signature, n_attempts from failure_clusters where n_attempts >= ? "
                        "and stage <> 'verify' order by n_attempts desc", [min_support]).to_pylist()
    passing = wh.query("select ir_text, features from attempts where outcome in ('checked', 'measured')").to_pylist()
    corpus = [(p.name, p.seed_text()) for p in list_problems()]
    corpus += [(f"passing-{i}", r["ir_text"]) for i, r in enumerate(passing)]
    out = []
    n_rules = len(current.learned_rules)
    for c in clusters:
        if c["signature"] in seen:
            continue
        failing = wh.query("select ir_text, features, gpu_seconds from attempts where signature = ?",
                           [c["signature"]]).to_pylist()
        prop = mine_rule(c["signature"], [json.loads(f["features"]) for f in failing],
                         [json.loads(p["features"]) for p in passing], f"harness.learned_{n_rules + len(out) + 1}",
                         min_support)
        if prop is None:
            continue
        proposed = current.apply(prop.kind, prop.payload, current.version + 1)
        gate = corpus_gate(current, proposed, corpus, [(f["ir_text"], f["gpu_seconds"] or 0.0) for f in failing])
        out.append((prop, gate.to_dict()))
    cal = _mine_calibration(wh, current)
    if cal is not None and cal.signature not in seen:
        # a refit changes no verdict: its gate is the held-out error it would remove
        out.append((cal, {"passed": True, "kind": "calibration", **cal.evidence}))
    return out


def _mine_calibration(wh: Warehouse, current: HarnessSpec) -> Proposal | None:
    rows = wh.query("""
        select e.predicted_ms, e.measured_ms, json_extract_string(a.features, '$.mma_atom') as atom
        from cost_model_error e join attempts a using (attempt_id)
        where e.kind = 'search' order by a.created_at""").to_pylist()
    if not rows:
        return None
    model = CostModel()
    model.eff.update(dict(current.cost_eff))
    return mine_calibration([(r["predicted_ms"], r["measured_ms"], r["atom"] or "fma") for r in rows], model)


def record_proposal(warehouse_root: str, prop: Proposal, gate: dict[str, Any], flow_run_id: str | None) -> str:
    pid = "p" + uuid.uuid4().hex[:8]
    Warehouse(warehouse_root).append("proposals", [{
        "proposal_id": pid, "kind": prop.kind, "signature": prop.signature, "title": prop.title,
        "evidence": json.dumps(prop.evidence), "payload": json.dumps(prop.payload), "gate_report": json.dumps(gate),
        "flow_run_id": flow_run_id, "base_version": load_harness(warehouse_root).version, "created_at": now()}])
    return pid


def get_proposal(warehouse_root: str, proposal_id: str) -> dict[str, Any]:
    rows = Warehouse(warehouse_root).query("select * from proposals_latest where proposal_id = ?",
                                           [proposal_id]).to_pylist()
    if not rows:
        raise CakeError(f"no proposal `{proposal_id}`; `cake harness proposals` lists them")
    return rows[0]


def apply_decision(warehouse_root: str, proposal_id: str, approve: bool, reason: str,
                   decided_by: str) -> int | None:
    """Record a decision; an approval creates (and exports) the next harness version, returned.
    Decisions on one warehouse are serialised (:func:`_decision_lock`): two approvals at the same
    moment get versions N+1 and N+2, and a proposal is decided once."""
    with _decision_lock(warehouse_root):
        p = get_proposal(warehouse_root, proposal_id)
        if p["status"] != "pending":
            raise AlreadyDecided(f"proposal `{proposal_id}` was already {p['status']}")
        wh = Warehouse(warehouse_root)
        new_version = None
        if approve:
            current = load_harness(warehouse_root)
            new_version = current.version + 1
            spec = current.apply(p["kind"], json.loads(p["payload"]), new_version)
            wh.append("harness_versions", [{"version": new_version, "parent": current.version,
                                            "proposal_id": proposal_id, "spec": spec.to_json(),
                                            "created_at": now()}])
            spec.export(export_dir(warehouse_root))
        wh.append("decisions", [{"proposal_id": proposal_id, "decision": "approved" if approve else "rejected",
                                 "reason": reason, "decided_by": decided_by, "decided_at": now(),
                                 "new_version": new_version}])
        return new_version


@contextlib.contextmanager
def _decision_lock(warehouse_root: str):
    """An exclusive lock on the warehouse's ``locks/decisions.lock`` (flock: released if the holder dies)."""
    with open(Warehouse(warehouse_root).root / "locks" / "decisions.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _flow_run_state(flow_run_id: str) -> str | None:
    """The flow run's state type (PAUSED, RUNNING, COMPLETED...), None if unknown or unreachable."""
    import asyncio

    async def state() -> str | None:
        async with get_client() as client:
            fr = await client.read_flow_run(flow_run_id)
            return fr.state.type.value if fr.state else None

    try:
        return asyncio.run(state())
    except Exception:
        return None


def _wait_until_settled(flow_run_id: str, wait_s: float) -> str | None:
    """A proposal is recorded just before its flow run pauses: wait out that moment."""
    deadline = time.monotonic() + wait_s
    state = _flow_run_state(flow_run_id)
    while state in ("RUNNING", "PENDING", "SCHEDULED") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = _flow_run_state(flow_run_id)
    return state


def decide_proposal(proposal_id: str, approve: bool, reason: str, decided_by: str,
                    warehouse_root: str, wait_s: float = 60.0) -> int | None:
    """Approve or reject a proposal: resume its paused flow run if it waits, else record it here.

    Returns the new harness version for an approval.
    """
    p = get_proposal(warehouse_root, proposal_id)
    if p["status"] != "pending":
        raise AlreadyDecided(f"proposal `{proposal_id}` was already {p['status']}")
    if p["flow_run_id"] and _wait_until_settled(p["flow_run_id"], wait_s=30.0) == "PAUSED":
        resume_flow_run(p["flow_run_id"], run_input={"approve": approve, "reason": reason,
                                                      "decided_by": decided_by})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            q = get_proposal(warehouse_root, proposal_id)
            if q["status"] != "pending":
                return q["new_version"]
            time.sleep(0.5)
        raise CakeError(f"the flow run {p['flow_run_id']} was resumed but did not record the decision within "
                        f"{wait_s:.0f} s; look at it in the Prefect UI")
    return apply_decision(warehouse_root, proposal_id, approve, reason, decided_by)
