"""Mined-rule predicates: a conjunction of comparisons over catalogue features, as plain data.

A predicate is data, never code: ``{"all": [{"feature": "view.fixed.max_tiles", "op": ">", "value": 1.0}]}``.
It holds for a program (and its run's shapes) when every comparison holds on the program's catalogue
(:mod:`cake_core.harness.catalogue`); a comparison with an absent feature is false, except on count
features, which read 0.
"""
from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any, Callable

from cake_core.harness.catalogue import Catalogue, describe, is_known
from cake_core.harness.errors import HarnessDataError

OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_ORDERED = ("<", "<=", ">", ">=")
_NEGATION = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_WORDS = {"==": "is", "!=": "is not", "<": "is below", "<=": "is at most", ">": "is above", ">=": "is at least"}


@dataclass(frozen=True)
class Atom:
    """``feature op value``: one comparison."""

    feature: str
    op: str
    value: bool | int | float | str

    def holds(self, cat: Catalogue) -> bool:
        got = cat.get(self.feature)
        if got is None:
            return False
        if self.op in _ORDERED and (isinstance(got, (str, bool)) or isinstance(self.value, (str, bool))):
            return False
        return bool(OPS[self.op](got, self.value))

    def text(self) -> str:
        return f"{self.feature} {self.op} {_fmt(self.value)}"

    def words(self) -> str:
        """The comparison in words, e.g. "`load` ops with guard=False is at least 1"."""
        return f"{describe(self.feature)} {_WORDS[self.op]} {_fmt(self.value)}"

    def negated_words(self) -> str:
        return f"{describe(self.feature)} {_WORDS[_NEGATION[self.op]]} {_fmt(self.value)}"

    def to_data(self) -> dict[str, Any]:
        return {"feature": self.feature, "op": self.op, "value": self.value}


@dataclass(frozen=True)
class Predicate:
    """A conjunction of atoms (at least one)."""

    atoms: tuple[Atom, ...]

    def holds(self, cat: Catalogue) -> bool:
        return all(a.holds(cat) for a in self.atoms)

    def text(self) -> str:
        return " and ".join(a.text() for a in self.atoms)

    def key(self) -> str:
        """Identity of the condition, whatever the order its atoms were found in."""
        return json.dumps(sorted([a.feature, a.op, a.value] for a in self.atoms), default=str)

    def to_data(self) -> dict[str, Any]:
        return {"all": [a.to_data() for a in self.atoms]}

    @staticmethod
    def from_data(data: Any, where: str = "predicate") -> "Predicate":
        """Read a predicate; a malformed one raises HarnessDataError naming what is wrong.

        The rules of harness versions before the catalogue were lists of ``[feature, value]`` pairs over
        the stored IR features; they read as equalities over the ``ir.`` family.
        """
        if isinstance(data, list):
            try:
                return Predicate(tuple(Atom(f"ir.{k}", "==", v) for k, v in data))
            except (TypeError, ValueError):
                raise HarnessDataError(f"{where}: a legacy predicate is a list of [feature, value] pairs, "
                                       f"got {json.dumps(data)[:120]}") from None
        if not (isinstance(data, dict) and isinstance(data.get("all"), list) and data["all"]):
            raise HarnessDataError(f"{where}: a predicate reads {{\"all\": [{{\"feature\": ..., \"op\": ..., "
                                   f"\"value\": ...}}, ...]}}, got {json.dumps(data, default=str)[:120]}")
        atoms = []
        for i, a in enumerate(data["all"]):
            if not (isinstance(a, dict) and set(a) == {"feature", "op", "value"}):
                raise HarnessDataError(f"{where}: comparison {i} must have exactly feature, op and value")
            if not (isinstance(a["feature"], str) and is_known(a["feature"])):
                raise HarnessDataError(f"{where}: comparison {i} names `{a['feature']}`, not a catalogue feature "
                                       "(families: op., order., sched., res., const., shape., view., ir.)")
            if a["op"] not in OPS:
                raise HarnessDataError(f"{where}: comparison {i} uses `{a['op']}`; use one of {', '.join(OPS)}")
            if not isinstance(a["value"], (bool, int, float, str)):
                raise HarnessDataError(f"{where}: comparison {i} compares with {a['value']!r}; values are "
                                       "numbers, booleans or strings")
            atoms.append(Atom(a["feature"], a["op"], a["value"]))
        return Predicate(tuple(atoms))


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return f"{v:.1f}"
    return repr(v) if isinstance(v, str) else str(v)
