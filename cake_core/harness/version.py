"""Harness versions: what an approved proposal changes in the environment.

Version 0 is the built-in harness. Each approved proposal makes a new version
from its parent: learned verifier rules added, cost-model factors refit,
tactics enabled or disabled. A spec is plain JSON, stored in the warehouse and
exported as a reviewable file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cake_core.ir.verify import LearnedRule


@dataclass(frozen=True)
class HarnessSpec:
    version: int = 0
    parent: int | None = None
    learned_rules: tuple[LearnedRule, ...] = ()
    cost_eff: tuple[tuple[str, float], ...] = ()     # cost-model efficiency overrides
    disabled_tactics: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version, "parent": self.parent,
            "learned_rules": [{"id": r.id, "predicate": [list(p) for p in r.predicate], "message": r.message,
                               "hint": r.hint} for r in self.learned_rules],
            "cost_eff": dict(self.cost_eff), "disabled_tactics": list(self.disabled_tactics)}, indent=2)

    @staticmethod
    def from_json(text: str) -> "HarnessSpec":
        d = json.loads(text)
        return HarnessSpec(
            d["version"], d.get("parent"),
            tuple(LearnedRule(r["id"], tuple((k, v) for k, v in r["predicate"]), r["message"], r.get("hint", ""))
                  for r in d.get("learned_rules", [])),
            tuple(sorted(d.get("cost_eff", {}).items())), tuple(d.get("disabled_tactics", [])))

    def apply(self, kind: str, payload: dict[str, Any], new_version: int) -> "HarnessSpec":
        """The spec after an approved proposal of ``kind`` with ``payload``."""
        nxt = replace(self, version=new_version, parent=self.version)
        if kind == "rule":
            rule = LearnedRule(payload["id"], tuple((k, v) for k, v in payload["predicate"]),
                               payload["message"], payload.get("hint", ""))
            return replace(nxt, learned_rules=self.learned_rules + (rule,))
        if kind == "calibration":
            eff = dict(self.cost_eff)
            eff.update(payload["eff"])
            return replace(nxt, cost_eff=tuple(sorted(eff.items())))
        if kind == "tactic":
            disabled = set(self.disabled_tactics) | set(payload.get("disable", []))
            disabled -= set(payload.get("enable", []))
            return replace(nxt, disabled_tactics=tuple(sorted(disabled)))
        raise ValueError(f"unknown proposal kind `{kind}`")

    def export(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"harness-v{self.version}.json"
        path.write_text(self.to_json() + "\n")
        return path
