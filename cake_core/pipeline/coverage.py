"""Which shapes of a shape set a set of kernels can serve: the shape's own rule, then each kernel's domain
(``ir.domain``: a static extent, a tile multiple, a TMA stride) decides, before anything is launched. A shape no
kernel admits is what a dispatcher must refuse by name or hand to a fallback.

Imports: ``ir`` and ``problems`` only; nothing is run or compiled."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cake_core.ir.domain import domain_violations
from cake_core.ir.program import Program
from cake_core.problems.base import Problem, Shape, shape_key


@dataclass
class Coverage:
    """Per kernel, the shapes its domain admits; the union; and, for the shapes no kernel admits, why."""

    shapes: list[Shape]
    roles: list[str]
    admitted: dict[str, list[bool]] = field(default_factory=dict)        # kernel -> one flag per shape
    refusals: dict[str, Counter] = field(default_factory=dict)            # kernel -> bound text -> shapes
    invalid: dict[str, str] = field(default_factory=dict)                 # shape key -> the problem's own refusal

    def covered(self) -> list[bool]:
        """One flag per shape: some kernel admits it."""
        return [any(flags[i] for flags in self.admitted.values()) for i in range(len(self.shapes))]

    def uncovered(self) -> list[Shape]:
        return [s for s, c in zip(self.shapes, self.covered()) if not c]


def _bound(message: str) -> str:
    """The bound a domain diagnostic names, without the shape (``D = 256 > 128`` -> ``D > 128``)."""
    text = message.split(": ", 1)[-1].split(", the ")[0]
    left, _, right = text.partition(" > ")
    return f"{left.split(' = ')[0]} > {right}" if right else text


def coverage(problem: Problem, shapes: list[Shape], roles: list[str], programs: dict[str, Program]) -> Coverage:
    """The coverage of ``shapes`` (with their ``roles``) by ``programs`` (name -> parsed program)."""
    cov = Coverage(list(shapes), list(roles))
    for s in shapes:
        why = problem.shape_error(s)
        if why:
            cov.invalid[shape_key(s)] = why
    for name, program in programs.items():
        flags, why = [], Counter()
        for s in shapes:
            if shape_key(s) in cov.invalid:
                flags.append(False)
                continue
            refused = domain_violations(program, s)
            flags.append(not refused)
            for bound in {_bound(d.message) for d in refused}:
                why[bound] += 1
        cov.admitted[name], cov.refusals[name] = flags, why
    return cov
