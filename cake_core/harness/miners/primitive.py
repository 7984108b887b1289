"""The primitive miner: a recurring op pattern in winning kernels, promoted to a named composite op.

Winners are the best passing attempts of each run. Every run of consecutive op statements in one block
(three to eight, see :func:`cake_core.harness.composite.windows`) is abstracted into a template over its
buffers, slots, views and index expressions; a template that recurs in the winners of at least two
problems becomes a composite whose expansion is the template. The longest such template wins (it
saves the most text per call), then the one in the most winners. Templates inside an approved composite
are not proposed again as composites of their own.
"""
from __future__ import annotations

from typing import Sequence

from cake_core.harness.composite import Composite, Occurrence, composite_name, template_key, used_names, windows
from cake_core.harness.evidence import excerpt
from cake_core.harness.proposal import Proposal
from cake_core.harness.records import AttemptRecord

LENGTHS = range(3, 9)


def _covered(existing: Sequence[Composite]) -> set[str]:
    """Keys of every contiguous part (three statements or more) of the approved composites."""
    out = set()
    for c in existing:
        kinds = dict(c.operands)
        for i in range(len(c.body)):
            for j in range(i + LENGTHS.start, len(c.body) + 1):
                part = c.body[i:j]
                used = used_names(part, list(kinds))
                out.add(template_key(part, used, {n: kinds[n] for n in used}))
    return out


def mine_primitive(winners: Sequence[AttemptRecord], existing: Sequence[Composite] = (), min_problems: int = 2,
                   min_winners: int = 3) -> tuple[Proposal | None, dict]:
    """A composite proposal from the op patterns the winners share, or None with the reason."""
    found: dict[str, list[tuple[AttemptRecord, Occurrence]]] = {}
    for w in winners:
        if w.program is None:
            continue
        seen_here = set()
        for occ in windows(w.program, LENGTHS):
            k = occ.key()
            if k not in seen_here:           # a pattern counts once per kernel
                seen_here.add(k)
                found.setdefault(k, []).append((w, occ))
    covered = _covered(existing)
    ranked = []
    for k, occs in found.items():
        problems = {w.problem for w, _ in occs}
        if k in covered or len(problems) < min_problems or len(occs) < min_winners:
            continue
        ranked.append((-len(occs[0][1].nodes), -len(problems), -len(occs), k))
    if not ranked:
        return None, {"signature": "primitive", "why": f"no op pattern of {LENGTHS.start}+ statements recurs in "
                                                       f"the winners of {min_problems} problems "
                                                       f"({len(winners)} winners read)"}
    *_, key = min(ranked)
    occs = found[key]
    _, occ = occs[0]
    problems = sorted({w.problem for w, _ in occs})
    name = composite_name(occ.nodes, [c.name for c in existing])
    comp = Composite(name, occ.operands, occ.body,
                     f"{len(occ.body)} statements that recur in {len(occs)} winning kernels of "
                     f"{', '.join(problems)}: " + "; ".join(occ.body))
    examples = [{"attempt_id": w.attempt_id, "run_id": w.run_id, "problem": w.problem, "score": w.score,
                 "score_basis": w.score_basis, "excerpt": excerpt(w.program.text(), _lines(w, o))}
                for w, o in _one_per_problem(occs)[:3]]
    evidence = {
        "definition": {"composite": comp.to_data(), "signature": comp.signature(), "reference": comp.reference()},
        "cluster": {"signature": f"primitive:{name}", "winners_read": len(winners), "winners_with_pattern": len(occs),
                    "problems": problems, "statements_saved_per_call": len(occ.body) - 1},
        "examples": examples,
    }
    return Proposal("primitive", f"primitive:{name}", f"composite op {comp.signature()}",
                    {"composite": comp.to_data()}, evidence), {}


def _one_per_problem(occs):
    seen, out = set(), []
    for w, o in sorted(occs, key=lambda x: (x[0].score if x[0].score is not None else float("inf"))):
        if w.problem not in seen:
            seen.add(w.problem)
            out.append((w, o))
    return out


def _lines(w: AttemptRecord, occ: Occurrence) -> list[int]:
    """Lines of the occurrence in the winner's canonical text (the nodes of a reparse carry them)."""
    from cake_core.ir.text import parse
    re_prog = parse(w.program.text()).program
    if re_prog is None:
        return []
    for o in windows(re_prog, range(len(occ.nodes), len(occ.nodes) + 1)):
        if o.key() == occ.key():
            return [n.line for n in o.nodes]
    return []
