"""The tactic miner: a sequence of tactics that made kernels faster on two or more problems, as a macro.

Lineage comes from the attempts: each passing mutant names its parents (IR hashes) and the tactics of
its step (``candidate.tactic``, ``+``-joined; a macro's name stands for its steps). A step *wins* when
the child passed and scores lower than its parent in the same run (measured geomean on a GPU, the cost
model's predicted geomean on a CPU: the evidence says which). The candidate sequences are the tactics of
one winning step when it chained two or more, and the tactics of two consecutive winning steps (a
winning parent step followed by a winning child step). A sequence that won on at least ``min_problems``
problems becomes a macro tactic; the most problems, then the most wins, then the largest median
speed-up is proposed.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from cake_core.harness.evidence import excerpt
from cake_core.harness.macro import Macro, flatten, macro_name
from cake_core.harness.proposal import Proposal
from cake_core.harness.records import AttemptRecord
from cake_core.model.base import geomean

_NOT_TACTICS = ("seed", "best-known")
MIN_SPEEDUP = 1.01        # a win is at least 1% faster


def wins(attempts: Sequence[AttemptRecord], macros: tuple[Macro, ...] = ()) -> list[dict]:
    """Every winning step and pair of consecutive winning steps, with its tactic sequence and speed-up."""
    by_run: dict[str, dict[str, AttemptRecord]] = {}
    for a in attempts:
        if a.passed and a.score is not None and a.ir_hash:
            best = by_run.setdefault(a.run_id, {}).get(a.ir_hash)
            if best is None or a.score < best.score:
                by_run[a.run_id][a.ir_hash] = a

    def parent_of(a: AttemptRecord) -> AttemptRecord | None:
        ps = [by_run.get(a.run_id, {}).get(h) for h in a.parents]
        ps = [p for p in ps if p is not None]
        return min(ps, key=lambda p: p.score) if ps else None

    def step(a: AttemptRecord) -> tuple[list[str], AttemptRecord, float] | None:
        if not a.tactic or a.tactic in _NOT_TACTICS:
            return None
        p = parent_of(a)
        if p is None or a.score <= 0 or p.score / a.score < MIN_SPEEDUP:
            return None
        return flatten(a.tactic, macros), p, p.score / a.score

    out = []
    for run in by_run.values():
        for a in run.values():
            s = step(a)
            if s is None:
                continue
            seq, parent, speedup = s
            if len(seq) >= 2:
                out.append({"steps": tuple(seq), "child": a, "parent": parent, "speedup": speedup, "chained": 1})
            before = step(parent)
            if before is not None:
                out.append({"steps": tuple(before[0] + seq), "child": a, "parent": before[1],
                            "speedup": before[2] * speedup, "chained": 2})
    return out


def mine_tactic(attempts: Sequence[AttemptRecord], macros: tuple[Macro, ...] = (), min_problems: int = 2,
                max_steps: int = 4) -> tuple[Proposal | None, dict]:
    """A macro tactic proposal, or None with the reason."""
    found: dict[tuple[str, ...], list[dict]] = {}
    for w in wins(attempts, macros):
        if len(w["steps"]) <= max_steps:
            found.setdefault(w["steps"], []).append(w)
    existing = {m.steps for m in macros}
    ranked = []
    for seq, ws in found.items():
        problems = {w["child"].problem for w in ws}
        if seq in existing or len(problems) < min_problems:
            continue
        ranked.append((-len(problems), -len(ws), -statistics.median(w["speedup"] for w in ws), seq))
    if not ranked:
        return None, {"signature": "tactic", "why": f"no tactic sequence won on {min_problems} problems "
                                                    f"({sum(len(v) for v in found.values())} winning steps read)"}
    *_, seq = min(ranked)
    ws = found[seq]
    problems = sorted({w["child"].problem for w in ws})
    basis = sorted({w["child"].score_basis or "unknown" for w in ws})
    speedups = [w["speedup"] for w in ws]
    macro = Macro(macro_name(seq), seq, f"won {len(ws)} times on {', '.join(problems)} "
                                         f"(median {statistics.median(speedups):.3g}x, by {'/'.join(basis)} time)")
    tried = _tried(attempts, seq, macros)
    examples = []
    for p in problems:
        w = max((w for w in ws if w["child"].problem == p), key=lambda w: w["speedup"])
        c = w["child"]
        examples.append({"problem": p, "attempt_id": c.attempt_id, "parent_attempt_id": w["parent"].attempt_id,
                         "run_id": c.run_id, "tactics": c.tactic, "parent_score": w["parent"].score,
                         "score": c.score, "score_basis": c.score_basis, "speedup": round(w["speedup"], 4),
                         "excerpt": excerpt(c.ir_text, [])})
    evidence = {
        "definition": {"macro": macro.to_data()},
        "cluster": {"signature": "tactic:" + "+".join(seq), "wins": len(ws), "problems": problems,
                    "median_speedup": round(statistics.median(speedups), 4),
                    "geomean_speedup": round(geomean(speedups), 4),
                    "score_basis": basis, "tried": tried},
        "examples": examples,
    }
    return Proposal("tactic", "tactic:" + "+".join(seq), f"macro tactic {macro.name} = {' then '.join(seq)}",
                    {"macro": macro.to_data()}, evidence), {}


def _tried(attempts: Sequence[AttemptRecord], seq: tuple[str, ...], macros: tuple[Macro, ...]) -> dict[str, int]:
    """How often one step applied exactly ``seq``, and how often that step passed."""
    steps = [a for a in attempts if a.tactic and tuple(flatten(a.tactic, macros)) == seq]
    return {"single_step_attempts": len(steps), "single_step_passed": sum(a.passed for a in steps)}
