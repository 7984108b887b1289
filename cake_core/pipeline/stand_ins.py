"""The kernels a portfolio region's sweep measures beside its finalists: a stand-in for each row they serve badly.

A region's run measures its finalists (each searched shape's winner and the run's best) on every other row of
the portfolio. A finalist's domain can leave rows out (a kernel for ``D % 8 == 0`` on a row with an odd ``D``),
and then a row gets only what else holds it among the finalists, often the naive seed, although the run scored
a faster kernel that holds the row. So, per sweep row: the run's best-scored kernel whose domain holds it; where
that kernel is not a finalist, it is measured on that row too (and only there). The rows a finalist of the run's
best score holds cost nothing more.

Pure: ``ir`` and ``problems`` only; nothing is run or compiled.
"""
from __future__ import annotations

from cake_core.ir.domain import domain_violations
from cake_core.ir.program import Program
from cake_core.problems.base import Shape


def stand_ins(ranked: list[tuple[str, Program]], finalists: set[str], rows: list[Shape]) -> dict[str, list[Shape]]:
    """``ranked``: the run's scored kernels (attempt id, program), best score first. Returns, per kernel that is
    not a finalist, the rows (in ``rows``' order) where it is the best-ranked kernel whose domain holds the row.
    A row no ranked kernel holds, or whose best-ranked holder is a finalist, gets none."""
    out: dict[str, list[Shape]] = {}
    for row in rows:
        holder = next((aid for aid, program in ranked if not domain_violations(program, row)), None)
        if holder is not None and holder not in finalists:
            out.setdefault(holder, []).append(row)
    return out

