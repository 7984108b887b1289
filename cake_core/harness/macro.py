"""Macro tactics: a sequence of existing tactics, promoted by the tactic miner, applied as one step.

A macro is data (a name and the tactic names it chains); the tactic agent gets it as one more row of
its tactic table, with its own track record. Applying it applies each step in order to the result of the
one before; where a step does not apply, neither does the macro.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from cake_core.harness.errors import HarnessDataError
from cake_core.ir.program import Program

Tactic = Callable[..., Program]       # cake_core.agents.tactics: (program, rng, bounds=None), or Refused
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True)
class Macro:
    name: str
    steps: tuple[str, ...]
    summary: str = ""

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "steps": list(self.steps), "summary": self.summary}

    @staticmethod
    def from_data(d: Any) -> "Macro":
        if not (isinstance(d, dict) and isinstance(d.get("name"), str) and _NAME.match(d["name"])):
            raise HarnessDataError(f"a macro tactic needs a name of letters, digits, _ and . (no `+`, which joins "
                                   f"the tactics of one step); got {str(d)[:80]}")
        steps = d.get("steps")
        if not (isinstance(steps, list) and len(steps) >= 2 and all(isinstance(s, str) and _NAME.match(s)
                                                                       for s in steps)):
            raise HarnessDataError(f"macro `{d['name']}`: steps are two or more tactic names")
        return Macro(d["name"], tuple(steps), str(d.get("summary", "")))


def macro_name(steps: tuple[str, ...]) -> str:
    return "macro_" + "_".join(steps)


def chain(macro: Macro, tactics: Mapping[str, Tactic]) -> Tactic:
    """The macro as a tactic over ``tactics`` (which must hold every step): a step that refuses refuses the
    macro, with that step's reason."""
    fns = [tactics[s] for s in macro.steps]

    def apply(p: Program, rng: np.random.Generator, bounds=None) -> Program:
        for fn in fns:
            p = fn(p, rng, bounds=bounds)
        return p
    apply.__doc__ = f"{macro.summary or 'macro'}: " + " then ".join(macro.steps)
    return apply


def with_macros(base: Mapping[str, Tactic], macros: tuple[Macro, ...], disabled: tuple[str, ...] = ()
                ) -> dict[str, Tactic]:
    """``base`` without the disabled tactics, plus each macro whose steps are all there (earlier macros may
    be steps of later ones)."""
    out = {k: v for k, v in base.items() if k not in disabled}
    for m in macros:
        if m.name not in disabled and all(s in out for s in m.steps):
            out[m.name] = chain(m, out)
    return out


def flatten(step: str, macros: tuple[Macro, ...]) -> list[str]:
    """A lineage step's tactics with macros replaced by their steps."""
    by_name = {m.name: m for m in macros}
    out: list[str] = []
    for t in step.split("+"):
        if t in by_name:
            for s in by_name[t].steps:
                out += flatten(s, macros)
        elif t:
            out.append(t)
    return out
