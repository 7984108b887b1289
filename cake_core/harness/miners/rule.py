"""The rule miner: a predicate over the feature catalogue that separates a failure cluster from every pass.

For a cluster (any stage: verify, compile, check, time), every catalogue feature proposes the comparisons
that hold on all of the cluster's attempts: equality for booleans and names, and for numbers the most
general threshold that still keeps out the passing attempts on one side (``> p`` where ``p`` is the
largest passing value below every failing one, and ``< q`` likewise above). The miner takes the smallest
conjunction of such comparisons (up to three, none of them redundant) that holds for no attempt that
passed, preferring
relations of views and shapes and op patterns to one problem's dimensions, schedule knobs, resources
and consts, and then the condition that also catches the most other failures; it offers a few, in that
order, and the review proposes the first that the corpus gate passes (a hand-written kernel the runs
never saw may meet the first). A condition that picks out exactly the attempts a built-in rule already
flagged (a warning promoted to an error is not a new rule) is passed over.

The mined rule's message and hint are written from its evidence: the condition in words, how many
attempts failed so and at which stage, what the failure said.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from typing import Sequence

from cake_core.harness.catalogue import MINED_FAMILIES, describe, family
from cake_core.harness.evidence import excerpt
from cake_core.harness.predicate import Atom, Predicate
from cake_core.harness.proposal import Proposal
from cake_core.harness.records import AttemptRecord, ClusterRecord
from cake_core.outcome import Severity
from cake_core.ir.verify import RULES

# Lower is preferred: a relation between views and shapes holds on any problem, an op pattern names a
# construct, a dimension of one problem is narrower, and a schedule knob, a resource or a size narrower still.
_PRIORITY = {"view": 0, "op": 1, "order": 1, "shape": 1, "sched": 2, "res": 3, "const": 4}
_OUTCOME_WORDS = {"verify_failed": "failed verification", "compile_failed": "failed to compile",
                  "wrong": "computed wrong results", "runtime_fault": "faulted", "timeout": "hung"}
MAX_ATOMS = 3
CANDIDATES = 6         # conditions offered to the gate, the preferred first
_BEAM = (60, 24)          # atoms tried in pairs, in triples


def candidate_atoms(failing: Sequence[AttemptRecord], passing: Sequence[AttemptRecord]
                    ) -> list[tuple[Atom, frozenset[int]]]:
    """Comparisons true on every failing attempt, each with the indices of the passing attempts it excludes."""
    cats = [f.catalogue for f in failing]
    pcats = [p.catalogue for p in passing]
    names = set().union(*(c.values for c in cats))
    out = []
    for name in sorted(names):
        if family(name) not in MINED_FAMILIES:
            continue
        fv = [c.get(name) for c in cats]
        if any(v is None for v in fv):
            continue
        pv = [c.get(name) for c in pcats]
        if all(isinstance(v, (bool, str)) for v in fv):
            if len(set(fv)) == 1:
                out.append(Atom(name, "==", fv[0]))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fv):
            lo, hi = min(fv), max(fv)
            nums = [v for v in pv if isinstance(v, (int, float)) and not isinstance(v, bool)]
            below = [v for v in nums if v < lo]
            above = [v for v in nums if v > hi]
            if below:
                out.append(Atom(name, ">", max(below)))
            if above:
                out.append(Atom(name, "<", min(above)))
    scored = []
    for a in out:
        excluded = frozenset(i for i, c in enumerate(pcats) if not a.holds(c))
        if excluded:
            scored.append((a, excluded))
    return scored


def _restates(pred: Predicate, attempts: Sequence[AttemptRecord], rules: set[str]) -> str | None:
    """The built-in rule whose firing picks out exactly the attempts ``pred`` holds for, if one does."""
    holds = frozenset(a.attempt_id for a in attempts if pred.holds(a.catalogue))
    for r in sorted(rules):
        if frozenset(a.attempt_id for a in attempts if r in a.rules) == holds:
            return r
    return None


def separating(failing: Sequence[AttemptRecord], passing: Sequence[AttemptRecord],
               others: Sequence[AttemptRecord] = (), limit: int = CANDIDATES) -> tuple[list[Predicate], list[dict]]:
    """Separating predicates in order of preference (smaller first), at most ``limit``, and the ones
    passed over with why."""
    atoms = candidate_atoms(failing, passing)
    everyone = frozenset(range(len(passing)))
    universe = list(failing) + list(passing) + list(others)
    # verifier rules that already stop what they flag (errors, not failure kinds): a condition that restates a
    # warning is a rule worth having, as the warning let the cluster through to fail later, on the GPU
    builtin = {r for a in failing for r in a.rules if r in RULES and RULES[r].severity is Severity.ERROR}
    passed_over: list[dict] = []
    chosen: list[Predicate] = []
    ranked = sorted(atoms, key=lambda ae: (-len(ae[1]), _PRIORITY[family(ae[0].feature)], ae[0].feature))
    for size in range(1, MAX_ATOMS + 1):
        pool = ranked if size == 1 else ranked[: _BEAM[size - 2]]
        found = []
        for combo in itertools.combinations(pool, size):
            if frozenset().union(*(e for _, e in combo)) != everyone:
                continue
            if size > 1 and any(frozenset().union(*(e for j, (_, e) in enumerate(combo) if j != i)) == everyone
                                for i in range(size)):
                continue        # a comparison it does not need: a narrower form of a smaller condition
            pred = Predicate(tuple(a for a, _ in combo))
            also = sum(pred.holds(o.catalogue) for o in others)
            found.append((sum(_PRIORITY[family(a.feature)] for a in pred.atoms), -also, pred.text(), pred))
        for *_, pred in sorted(found, key=lambda x: x[:3]):
            same = _restates(pred, universe, builtin)
            if same is not None:
                passed_over.append({"predicate": pred.to_data(), "why": f"picks out exactly the attempts the "
                                    f"built-in rule `{same}` already flags"})
            elif len(chosen) < limit:
                chosen.append(pred)
        if len(chosen) >= limit:
            break
    return chosen, passed_over


def rule_id(pred: Predicate) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", pred.atoms[0].feature.lower()).strip("_")
    return f"learned.{slug}.{hashlib.sha1(pred.key().encode()).hexdigest()[:6]}"


def mine_rule(cluster: ClusterRecord, failing: Sequence[AttemptRecord], passing: Sequence[AttemptRecord],
              others: Sequence[AttemptRecord] = (), min_support: int = 3) -> tuple[list[Proposal], dict]:
    """Rule proposals for ``cluster`` (its attempts ``failing``), the preferred first (the review gates them
    in that order and proposes the first the corpus gate passes), or none with the reason.

    ``others``: failing attempts of other clusters, to prefer the condition that generalises. Attempts
    that did not parse (no catalogue) take no part.
    """
    failing = [f for f in failing if f.catalogue is not None]
    passing = [p for p in passing if p.catalogue is not None]
    others = [o for o in others if o.catalogue is not None]
    if len(failing) < min_support:
        return [], {"signature": cluster.signature, "why": f"{len(failing)} parsed attempts, fewer than "
                                                           f"{min_support}"}
    preds, passed_over = separating(failing, passing, others)
    if not preds:
        why = "no condition of at most three catalogue comparisons holds for the cluster and no passing attempt"
        if passed_over:
            why = "every separating condition restates a built-in rule"
        return [], {"signature": cluster.signature, "why": why, "passed_over": passed_over}
    return [_proposal(cluster, p, failing, passing, others, passed_over) for p in preds], {}


def _proposal(cluster: ClusterRecord, pred: Predicate, failing: Sequence[AttemptRecord],
              passing: Sequence[AttemptRecord], others: Sequence[AttemptRecord], passed_over: list[dict]) -> Proposal:
    first = failing[0]
    outcome = _OUTCOME_WORDS.get(first.outcome, first.outcome)
    said = first.error_message or first.error_rule or first.outcome
    message = (f"{' and '.join(a.words() for a in pred.atoms)}: {len(failing)} attempts like this {outcome} at "
               f"the {cluster.stage} stage ({_short(said)}) and none passed")
    hint = "a kernel passes the rule where " + ", or ".join(a.negated_words() for a in pred.atoms)
    if first.error_rule and first.error_rule not in ("check.mismatch", "runtime.fault", "runtime.timeout"):
        hint += f" (the failure was `{first.error_rule}`)"
    payload = {"id": rule_id(pred), "predicate": pred.to_data(), "message": message, "hint": hint}
    examples = []
    for f in failing[:3]:
        cat = f.catalogue
        site = [cat.sites[a.feature].line for a in pred.atoms if a.feature in cat.sites]
        examples.append({"attempt_id": f.attempt_id, "run_id": f.run_id, "problem": f.problem,
                         "outcome": f.outcome, "error": _short(f.error_message or f.error_rule or ""),
                         "values": {a.feature: cat.get(a.feature) for a in pred.atoms},
                         "excerpt": excerpt(f.ir_text, site)})
    catches_others = [o.attempt_id for o in others if pred.holds(o.catalogue)]
    evidence = {
        "definition": {"predicate": pred.to_data(), "text": pred.text(),
                       "in_words": " and ".join(a.words() for a in pred.atoms),
                       "features": {a.feature: describe(a.feature) for a in pred.atoms},
                       "message": message, "hint": hint},
        "cluster": cluster.to_data(),
        "separation": {"failing": len(failing), "passing_checked": len(passing), "passing_matched": 0,
                       "other_failures_matched": len(catches_others),
                       "problems": sorted({f.problem for f in failing})},
        "passed_over": passed_over,
        "examples": examples,
    }
    return Proposal("rule", cluster.signature, f"reject programs where {pred.text()}", payload, evidence)


def _short(s: str, n: int = 140) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"
