"""Harness tasks: the current version, the review's records, proposals and decisions, in the warehouse.

The SQL lives here; the mining, deduplication and gating are ``cake_core.harness.review`` over plain
records. A proposal is stored with its key (``evidence.key``): the review reads every earlier proposal's
key, whatever its version or decision, and proposes nothing twice.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.flow_runs import resume_flow_run
from prefect.input import RunInput
from pydantic import Field

from cake_core.errors import CakeError
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.gate import GateCache, gpu_check
from cake_core.harness.proposal import Proposal, proposal_key
from cake_core.harness.gate_store import GateStore
from cake_core.harness.records import AttemptRecord, ClusterRecord, MeasuredRecord
from cake_core.harness.review import ReviewInput, review
from cake_core.harness.version import HarnessSpec
from cake_core.pipeline.rows import now
from cake_core.problems import find_problem
from cake_core.problems.base import ShapeSetError, parse_shape_key
from warehouse import Warehouse

REVIEW_ATTEMPTS = 50_000     # the newest attempts a review reads
GATE_CACHE = GateCache()     # the corpus's built-in verdicts and interpreter checks: pure, kept per process and,
#                              in a Cake home, on disk under cache/gate (gate_store) for later processes


class AlreadyDecided(CakeError):
    """The proposal was approved or rejected already (by the UI, the CLI or the corpus gate)."""


class Decision(RunInput):
    """What a reviewer answers to a paused proposal: both the decision and the reason are required (the
    Prefect UI's form refuses to resume without them), so an untouched form decides nothing."""

    decision: Literal["approve", "reject"] = Field(description="approve: a new harness version applies it; "
                                                               "reject: it is never proposed again")
    reason: str = Field(min_length=1, pattern=r"\S", description="why (kept with the decision)")
    decided_by: str = Field("prefect-ui", min_length=1, description="who decides")

    @property
    def approve(self) -> bool:
        return self.decision == "approve"


def _need_reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise CakeError("a decision needs a reason: say why with --reason (it is kept with the decision)")
    return reason.strip()


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


def _run_shapes(wh: Warehouse) -> dict[str, tuple[dict[str, int], ...]]:
    """The shapes each run checked its candidates on: those its predictions name, else (a run whose every
    candidate stopped at verify) its shape set as the evolve flow picks it."""
    out: dict[str, tuple[dict[str, int], ...]] = {}
    runs = {r["run_id"]: r for r in wh.query(
        "select run_id, problem, shape_set, gpu_model from runs_latest").to_pylist()}
    for r in wh.query("""select a.run_id, a.problem, list(distinct p.shape) as shapes
                         from predictions p join attempts a using (attempt_id) group by all""").to_pylist():
        prob = find_problem(r["problem"])
        if prob is not None:
            with contextlib.suppress(ShapeSetError):
                out[r["run_id"]] = tuple(parse_shape_key(k, prob.dims) for k in sorted(r["shapes"]))
    for run_id, r in runs.items():
        prob = find_problem(r["problem"])
        if run_id in out or prob is None:
            continue
        with contextlib.suppress(ShapeSetError):
            ss = prob.shape_set(r["shape_set"])
            out[run_id] = tuple(ss.shapes) if r["gpu_model"] else tuple(ss.cpu_shapes(prob.cpu_limit))
    return out


def load_review_input(warehouse_root: str) -> ReviewInput:
    """Attempts (with their run's shapes, diagnostics and score), clusters, measurements, earlier keys."""
    wh = Warehouse(warehouse_root)
    shapes = _run_shapes(wh)
    rules = {r["attempt_id"]: frozenset(r["rules"]) for r in wh.query(
        "select attempt_id, list(distinct rule) as rules from diagnostics group by 1").to_pylist()}
    rows = wh.query(f"""
        with m as (select attempt_id, exp(avg(ln(median_ms))) as ms from measurements
                   where correct and kind = 'search' and median_ms > 0 group by 1)
        select a.*, m.ms as measured_ms from attempts a left join m using (attempt_id)
        order by a.created_at desc limit {REVIEW_ATTEMPTS}""").to_pylist()
    attempts = []
    for r in rows:
        score, basis = (r["measured_ms"], "measured") if r["measured_ms"] else \
            ((r["predicted_ms"], "predicted") if r["predicted_ms"] else (None, None))
        attempts.append(AttemptRecord(
            r["attempt_id"], r["run_id"], r["problem"], r["ir_text"], r["outcome"], r["stage"], r["generation"],
            r["ir_hash"], tuple(r["parents"] or ()), r["tactic"], r["signature"], r["error_rule"],
            r["error_message"], r["gpu_seconds"] or 0.0, score, basis, r["created_at"],
            shapes.get(r["run_id"], ()), rules.get(r["attempt_id"], frozenset())))
    clusters = [ClusterRecord(c["signature"], c["stage"], c["rule"], c["n_attempts"], c["n_runs"], c["n_problems"],
                              c["gpu_seconds"] or 0.0, c["first_seen"], c["last_seen"])
                for c in wh.query("select * from failure_clusters").to_pylist()]
    measured = []
    for m in wh.query("""select m.attempt_id, a.problem, a.ir_text, m.shape, median(m.median_ms) as ms
                         from measurements m join attempts a using (attempt_id)
                         where m.correct and m.median_ms > 0 group by all""").to_pylist():
        prob = find_problem(m["problem"])
        if prob is not None:
            with contextlib.suppress(ShapeSetError):
                measured.append(MeasuredRecord(m["attempt_id"], m["problem"], m["ir_text"],
                                               parse_shape_key(m["shape"], prob.dims), m["ms"]))
    return ReviewInput(attempts, clusters, measured, known_keys(wh))


def known_keys(wh: Warehouse) -> dict[str, str]:
    """Every earlier proposal's key with what became of it (``approved``, ``rejected``, ``pending``)."""
    out: dict[str, str] = {}
    for p in wh.query("select proposal_id, kind, payload, evidence, status, base_version "
                      "from proposals_latest").to_pylist():
        try:
            key = json.loads(p["evidence"]).get("key") or proposal_key(p["kind"], json.loads(p["payload"]))
        except (HarnessDataError, json.JSONDecodeError, AttributeError):
            continue        # an unreadable old proposal cannot be the same change as a readable new one
        out[key] = f"{p['status']} as {p['proposal_id']} on v{p['base_version']}"
    return out


@task(name="mine-proposals", cache_policy=NO_CACHE)
def mine_proposals(warehouse_root: str, min_support: int, gpu_cache_dir: str | None = None) -> dict[str, Any]:
    """Mine every kind, deduplicated against all earlier proposals, each gated on the corpus (and on the
    GPU, building cubins under ``gpu_cache_dir``, when given): returns
    ``{"proposals": [(Proposal, gate report)], "skipped": [what was not proposed, and why]}``."""
    current = load_harness(warehouse_root)
    gpu = gpu_check(Path(gpu_cache_dir)) if gpu_cache_dir else None
    home_cache = Path(warehouse_root).parent / "cache"       # a Cake home's: its warehouse/ and cache/ side by side
    GATE_CACHE.store = GateStore(home_cache / "gate") if home_cache.is_dir() else None
    found, skipped = review(load_review_input(warehouse_root), current, min_support=min_support, cache=GATE_CACHE,
                            gpu=gpu)
    return {"proposals": [(r.proposal, r.gate) for r in found], "skipped": skipped}


def record_proposal(warehouse_root: str, prop: Proposal, gate: dict[str, Any], flow_run_id: str | None) -> str:
    pid = "p" + uuid.uuid4().hex[:8]
    evidence = {**prop.evidence, "key": prop.key}
    Warehouse(warehouse_root).append("proposals", [{
        "proposal_id": pid, "kind": prop.kind, "signature": prop.signature, "title": prop.title,
        "evidence": json.dumps(evidence, default=str), "payload": json.dumps(prop.payload),
        "gate_report": json.dumps(gate, default=str), "flow_run_id": flow_run_id,
        "base_version": load_harness(warehouse_root).version, "created_at": now()}])
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
    moment get versions N+1 and N+2, and a proposal is decided once; a decision without a reason is
    refused."""
    reason = _need_reason(reason)
    with _decision_lock(warehouse_root):
        p = get_proposal(warehouse_root, proposal_id)
        if p["status"] != "pending":
            raise AlreadyDecided(f"proposal `{proposal_id}` was already {p['status']}")
        wh = Warehouse(warehouse_root)
        new_version = None
        if approve:
            current = load_harness(warehouse_root)
            new_version = current.version + 1
            try:
                spec = current.apply(p["kind"], json.loads(p["payload"]), new_version)
            except HarnessDataError as e:
                raise CakeError(f"proposal `{proposal_id}` cannot be applied to harness v{current.version}: {e}; "
                                "reject it with `cake harness reject`") from None
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
    try:    # the sync client: callable from a thread whose event loop is already running
        with get_client(sync_client=True) as client:
            fr = client.read_flow_run(flow_run_id)
            return fr.state.type.value if fr.state else None
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

    Raises
    ------
    CakeError
        ``reason`` is empty, the proposal is unknown, or a resumed run did not record the decision in time.
    AlreadyDecided
        The proposal was decided already.
    """
    reason = _need_reason(reason)
    p = get_proposal(warehouse_root, proposal_id)
    if p["status"] != "pending":
        raise AlreadyDecided(f"proposal `{proposal_id}` was already {p['status']}")
    if p["flow_run_id"] and _wait_until_settled(p["flow_run_id"], wait_s=30.0) == "PAUSED":
        resume_flow_run(p["flow_run_id"], run_input={"decision": "approve" if approve else "reject",
                                                      "reason": reason, "decided_by": decided_by})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            q = get_proposal(warehouse_root, proposal_id)
            if q["status"] != "pending":
                return q["new_version"]
            time.sleep(0.5)
        raise CakeError(f"the flow run {p['flow_run_id']} was resumed but did not record the decision within "
                        f"{wait_s:.0f} s; look at it in the Prefect UI")
    return apply_decision(warehouse_root, proposal_id, approve, reason, decided_by)



# ------------------------------------------------------------------ carrying a harness to another warehouse

CHAIN_TABLES = ("proposals", "decisions", "harness_versions")     # in the order an import lands them


def harness_chain(warehouse_root: str, version: int | None = None) -> dict[str, Any]:
    """Harness version ``version`` (None: the newest approved) of a warehouse with every version it was built on,
    as plain rows: ``{"version": N, "harness_versions": [...], "proposals": [...], "decisions": [...]}`` (the
    approved proposals of versions 1..N and their decisions, each proposal's latest row), what
    :func:`import_harness_chain` lands in another warehouse.

    Raises
    ------
    CakeError
        The warehouse holds no approved harness change, or no version ``version``.
    """
    wh = Warehouse(warehouse_root)
    have = sorted(int(r["version"]) for r in wh.query("select distinct version from harness_versions").to_pylist())
    if not have:
        raise CakeError(f"{warehouse_root} holds no approved harness change (only the built-in v0): review its runs "
                        "with `cake harness review` and approve what passes, or pass another home")
    if version == 0:
        raise CakeError("harness version 0 is the built-in one, which learned nothing; name an approved version")
    if version is None:
        version = have[-1]
    if version not in have:
        raise CakeError(f"{warehouse_root} holds no harness version {version} (it has "
                        f"{', '.join(map(str, [0, *have]))}); `cake harness versions` lists them")
    versions = wh.query("""select * from harness_versions where version <= ?
                           qualify row_number() over (partition by version order by created_at) = 1
                           order by version""", [version]).to_pylist()
    ids = [v["proposal_id"] for v in versions if v["proposal_id"]]
    marks = ", ".join("?" * len(ids)) or "null"
    proposals = wh.query(f"""select * from proposals where proposal_id in ({marks})
                             qualify row_number() over (partition by proposal_id order by recorded_at desc) = 1
                             order by created_at""", ids).to_pylist()
    decisions = wh.query(f"""select * from decisions where proposal_id in ({marks}) and decision = 'approved'
                             qualify row_number() over (partition by proposal_id order by decided_at desc) = 1
                             order by decided_at""", ids).to_pylist()
    return {"version": version, "harness_versions": versions, "proposals": proposals, "decisions": decisions}


def chain_to_json(chain: dict[str, Any]) -> str:
    """``chain`` as JSON (timestamps as ISO text), the form it is kept in beside an experiment."""
    return json.dumps(chain, indent=1, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v))


def import_harness_chain(warehouse_root: str, chain: dict[str, Any]) -> HarnessSpec:
    """Land the harness versions of ``chain`` (:func:`harness_chain`, or its JSON read back) in the warehouse at
    ``warehouse_root``, with their proposals and decisions, so its runs can pin ``chain["version"]`` and its
    ``harness_effects`` and ``cake harness versions`` show each change; exports each version as
    ``harness/harness-vN.json`` beside the warehouse, as an approval does. Returns the newest spec.

    A warehouse that holds those versions already is left as it is (an experiment calls this again when it
    continues); the version rows land last, in one batch, so an import cut short lands no version and is done
    again whole.

    Raises
    ------
    CakeError
        The warehouse holds harness versions of its own.
    """
    wh = Warehouse(warehouse_root)
    want = {int(v["version"]): HarnessSpec.from_json(v["spec"]) for v in chain["harness_versions"]}
    have = {int(r["version"]): HarnessSpec.from_json(r["spec"]).to_json() for r in wh.query(
        "select version, spec from harness_versions qualify row_number() over "
        "(partition by version order by created_at) = 1").to_pylist()}
    if have and have != {v: spec.to_json() for v, spec in want.items()}:
        raise CakeError(f"{warehouse_root} holds harness versions of its own ({', '.join(map(str, sorted(have)))}); "
                        "a harness is carried only into a warehouse that has none, or has the same versions")
    if not have:
        for table in CHAIN_TABLES:
            wh.append(table, [_typed(wh, table, r) for r in chain[table]])
        for spec in want.values():
            spec.export(export_dir(warehouse_root))
    return want[int(chain["version"])]


def _typed(wh: Warehouse, table: str, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the ISO text of its timestamp columns (a chain read back from JSON) as datetimes."""
    stamps = {c.name for c in wh.schema.columns[table] if c.sql_type.upper().startswith("TIMESTAMP")}
    return {k: datetime.fromisoformat(v) if k in stamps and isinstance(v, str) else v for k, v in row.items()}
