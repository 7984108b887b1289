"""Learned verifier rules: approved harness proposals that run beside the built-in rules.

A learned rule is data: a stable id, a predicate over the rule feature catalogue, and the message and hint
its miner wrote from the evidence. ``verify(program, learned=...)`` calls :meth:`LearnedRule.diagnose`
with the run's shapes, so a rule over shape relations sees the shapes the candidate will run on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from cake_core.harness.catalogue import catalogue
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.predicate import Predicate
from cake_core.ir.program import Program
from cake_core.outcome import Diagnostic, Severity


@dataclass(frozen=True)
class LearnedRule:
    id: str
    predicate: Predicate
    message: str
    hint: str = ""

    def diagnose(self, program: Program, shapes: Sequence[dict[str, int]] = ()) -> list[Diagnostic]:
        """One error when the predicate holds: at the first node an op feature of it counted, else the
        kernel; the witness gives each compared feature's value in this program."""
        cat = catalogue(program, shapes)
        if not self.predicate.holds(cat):
            return []
        site = next((cat.sites[a.feature] for a in self.predicate.atoms if a.feature in cat.sites), None)
        witness = tuple(f"{a.feature} = {cat.get(a.feature)!r} (the rule: {a.op} {a.value!r})"
                        for a in self.predicate.atoms)
        line = site.line if site is not None and site.line else program.line
        col = site.col if site is not None and site.line else 1
        return [Diagnostic(self.id, Severity.ERROR, self.message, line, col, "kernel", self.hint, witness)]

    def to_data(self) -> dict[str, Any]:
        return {"id": self.id, "predicate": self.predicate.to_data(), "message": self.message, "hint": self.hint}

    @staticmethod
    def from_data(d: Any) -> "LearnedRule":
        if not (isinstance(d, dict) and isinstance(d.get("id"), str) and isinstance(d.get("message"), str)):
            raise HarnessDataError("a learned rule needs a string id, a predicate and a message; got "
                                   f"{str(d)[:120]}")
        return LearnedRule(d["id"], Predicate.from_data(d.get("predicate"), f"rule `{d['id']}`"), d["message"],
                           str(d.get("hint", "")))
