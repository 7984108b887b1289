"""A harness review: every miner over the warehouse's records, each proposal gated, nothing proposed twice.

:func:`review` reads plain records (the warehouse side fills them, ``tasks/harness.py``) and returns the
proposals that passed their miner, each with its corpus-gate report inside its evidence, and what was
not proposed and why. A proposal whose key (:func:`~cake_core.harness.proposal.proposal_key`) was
proposed before, in any version and whatever became of it, is not proposed again; nor is one that would
change nothing (a rule that stops no failure the verifier let through). A proposal the gate refuses
(a flip) *is* returned, with the refusal: the reviewer sees it, it is recorded as rejected and never
proposed again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from cake_core.agents.tactics import TACTICS
from cake_core.harness import calibration as cal
from cake_core.harness.gate import GateCache, GpuCheck, corpus, run_gate
from cake_core.harness.miners import mine_calibration, mine_primitive, mine_rule, mine_tactic
from cake_core.harness.proposal import Proposal
from cake_core.harness.records import AttemptRecord, ClusterRecord, MeasuredRecord
from cake_core.harness.version import KINDS, HarnessSpec
from cake_core.ir.text import parse
from cake_core.problems.base import shape_key

WINNERS_PER_RUN = 3


@dataclass
class ReviewInput:
    attempts: list[AttemptRecord]
    clusters: list[ClusterRecord] = field(default_factory=list)
    measured: list[MeasuredRecord] = field(default_factory=list)
    known: dict[str, str] = field(default_factory=dict)      # proposal key -> status (approved|rejected|pending)


@dataclass
class Reviewed:
    proposal: Proposal
    gate: dict[str, Any]


def read_programs(attempts: Sequence[AttemptRecord], harness: HarnessSpec) -> None:
    """Parse each attempt's text (composites of ``harness`` expanded) into ``program``; attempts of one
    program under the same shapes share one parse and one catalogue."""
    parsed: dict[str, Any] = {}
    cats: dict[tuple[str, str], Any] = {}
    for a in attempts:
        if a.program is None:
            if a.ir_text not in parsed:
                r = parse(harness.expand(a.ir_text).text)
                parsed[a.ir_text] = r.program if not any(d.is_error for d in r.diagnostics) else None
            a.program = parsed[a.ir_text]
        if a.program is not None:
            key = (a.program.hash, json.dumps(a.shapes, sort_keys=True))
            if key in cats:
                a.__dict__["catalogue"] = cats[key]      # AttemptRecord.catalogue is a cached property
            else:
                cats[key] = a.catalogue


def winners(attempts: Sequence[AttemptRecord], per_run: int = WINNERS_PER_RUN) -> list[AttemptRecord]:
    """The best passing attempts of each run (lowest score), one per IR hash."""
    by_run: dict[str, list[AttemptRecord]] = {}
    for a in sorted((a for a in attempts if a.passed and a.score is not None and a.program is not None),
                    key=lambda a: a.score):
        picked = by_run.setdefault(a.run_id, [])
        if len(picked) < per_run and a.ir_hash not in {b.ir_hash for b in picked}:
            picked.append(a)
    return [a for rows in by_run.values() for a in rows]


def samples(measured: Sequence[MeasuredRecord], harness: HarnessSpec) -> list[cal.Sample]:
    out = []
    for m in measured:
        r = parse(harness.expand(m.ir_text).text)
        if r.program is not None and m.measured_ms > 0:
            out.append(cal.Sample(m.attempt_id, m.problem, r.program, dict(m.shape), m.measured_ms,
                                  f"{m.problem}|{shape_key(m.shape)}"))
    return out


def review(data: ReviewInput, current: HarnessSpec, *, min_support: int = 3, cache: GateCache | None = None,
           gpu: GpuCheck | None = None, seed: int = 0, kinds: Sequence[str] = KINDS
           ) -> tuple[list[Reviewed], list[dict[str, Any]]]:
    """Mine, deduplicate and gate.

    Parameters
    ----------
    data : ReviewInput
        The warehouse's attempts (with their runs' shapes), clusters, measurements and earlier keys.
    current : HarnessSpec
        The harness the proposals would change.
    min_support : int
        Failing attempts a cluster needs before the rule miner reads it.
    cache : GateCache, optional
        Built-in verdicts and interpreter checks shared with earlier gates (pure results).
    gpu : GpuCheck, optional
        A GPU correctness check the gate runs too (see :func:`cake_core.harness.gate.gpu_check`).
    kinds : sequence of str
        The miners to run.

    Returns
    -------
    (list of Reviewed, list of dict)
        The proposals, each with its gate report (also in its evidence under ``gate``), and what was
        not proposed, each ``{"signature", "why", ...}``.
    """
    cache = cache if cache is not None else GateCache()
    read_programs(data.attempts, current)
    passing = [a for a in data.attempts if a.passed and a.program is not None]
    failures = [a for a in data.attempts if a.failed]
    kernels = corpus(passing)
    known = dict(data.known)
    known.update({p.key: "in the current version" for p in _current_as_proposals(current)})
    out: list[Reviewed] = []
    skipped: list[dict[str, Any]] = []

    def consider_first_passing(props: Sequence[Proposal], why: dict, **gate_kw: Any) -> None:
        """Gate the candidates in order; propose the first the gate passes, with the refused ones before
        it in its evidence, or (none passing) the first, refused, so the reviewer sees why."""
        if not props:
            skipped.append(why)
            return
        refused: list[tuple[Proposal, dict]] = []
        for prop in props:
            key = prop.key
            if key in known:
                skipped.append({"signature": prop.signature, "why": f"the same change was proposed before "
                                                                    f"({known[key]})", "key": key})
                if not known[key].startswith("rejected"):
                    return      # approved or awaiting a decision: no second answer to the same question
                continue
            gate = run_gate(prop, current, kernels, cache, seed=seed, gpu=gpu, **gate_kw)
            if not gate["passed"] and not gate["flips"] and _no_effect(gate):
                skipped.append({"signature": prop.signature, "why": "; ".join(gate["refusals"]), "key": key})
                continue
            if not gate["passed"]:
                refused.append((prop, gate))
                continue
            if refused:
                prop.evidence["refused_by_the_gate_first"] = [
                    {"title": p.title, "refusals": g["refusals"], "flips": g["flips"][:5]} for p, g in refused]
            accept(prop, gate)
            return
        if refused:
            accept(*refused[0])

    def accept(prop: Proposal, gate: dict) -> None:
        known[prop.key] = "pending in this review"
        prop.evidence["gate"] = gate
        out.append(Reviewed(prop, gate))

    def consider(prop: Proposal | None, why: dict, **gate_kw: Any) -> None:
        consider_first_passing([prop] if prop is not None else [], why, **gate_kw)

    if "rule" in kinds:
        for c in data.clusters:
            if c.n_attempts < min_support:
                continue
            members = [a for a in failures if a.signature == c.signature]
            others = [a for a in failures if a.signature != c.signature]
            stopped = _stopped_by(current, members)
            if stopped:
                skipped.append({"signature": c.signature, "why": "every attempt of the cluster is stopped by "
                                f"{', '.join(stopped)} of harness v{current.version}"})
                continue
            props, why = mine_rule(c, members, passing, others, min_support)
            consider_first_passing(props, why, failures=failures, passing=passing,
                                   cluster=[a.attempt_id for a in members])
    if "primitive" in kinds:
        prop, why = mine_primitive(winners(data.attempts), current.composites)
        consider(prop, why)
    if "calibration" in kinds:
        measured = samples(data.measured, current)
        prop, why = mine_calibration(measured, current.cost_model())
        consider(prop, why, samples=measured)
    if "tactic" in kinds:
        prop, why = mine_tactic(data.attempts, current.macros)
        consider(prop, why, tactics=current.tactics(TACTICS))
    return out, skipped


_NO_EFFECT = ("stopped no failure", "changes no prediction")


def _stopped_by(current: HarnessSpec, members: Sequence[AttemptRecord]) -> list[str]:
    """The current learned rules that together stop every parsed attempt of a cluster (none if some
    attempt gets through)."""
    ids: set[str] = set()
    parsed = [a for a in members if a.program is not None]
    for a in parsed:
        hit = [r.id for r in current.learned_rules if r.diagnose(a.program, a.shapes)]
        if not hit:
            return []
        ids |= set(hit)
    return sorted(ids) if parsed else []


def _no_effect(gate: dict[str, Any]) -> bool:
    return all(any(s in r for s in _NO_EFFECT) for r in gate["refusals"])


def _current_as_proposals(current: HarnessSpec) -> list[Proposal]:
    """The changes the current version already holds, as proposals (so their keys count as known)."""
    out = [Proposal("rule", "", "", r.to_data()) for r in current.learned_rules]
    out += [Proposal("primitive", "", "", {"composite": c.to_data()}) for c in current.composites]
    out += [Proposal("tactic", "", "", {"macro": m.to_data()}) for m in current.macros]
    return out
