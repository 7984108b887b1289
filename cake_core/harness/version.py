"""Harness versions: what approved proposals change in the environment around the agent.

Version 0 is the built-in harness. Each approved proposal makes a new version from its parent:

- ``rule``: a learned verifier rule (:class:`~cake_core.harness.learned.LearnedRule`) runs beside the
  built-in ones;
- ``primitive``: a composite op (:class:`~cake_core.harness.composite.Composite`) that candidates may call,
  expanded before verification;
- ``calibration``: refit cost-model factors (``cost_eff``), so the cost filter ranks with the refit model;
- ``tactic``: a macro tactic (:class:`~cake_core.harness.macro.Macro`) the tactic agent may apply as one step
  (older versions could also switch tactics off: ``disabled_tactics``).

A spec is plain JSON, stored in the warehouse and exported as a reviewable file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from cake_core.harness.composite import Composite, Expansion, contract, expand
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.learned import LearnedRule
from cake_core.harness.macro import Macro, Tactic, with_macros
from cake_core.ir.program import Program
from cake_core.ir.text import IRSyntaxError, parse_program
from cake_core.model.analytic import AnalyticModel

KINDS = ("rule", "primitive", "calibration", "tactic")


@dataclass(frozen=True)
class HarnessSpec:
    version: int = 0
    parent: int | None = None
    learned_rules: tuple[LearnedRule, ...] = ()
    composites: tuple[Composite, ...] = ()
    cost_eff: tuple[tuple[str, float], ...] = ()     # cost-model efficiency factors, refit
    macros: tuple[Macro, ...] = ()
    disabled_tactics: tuple[str, ...] = ()

    # ------------------------------------------------------------------ effects

    def cost_model(self, gpu: str = "H200") -> AnalyticModel:
        """The cost model this version ranks with: the analytic model with its refit factors."""
        model = AnalyticModel(gpu)
        if self.cost_eff:       # a calibrated model is another model: its predictions say so
            model = model.with_eff(dict(self.cost_eff), f"{model.version}+harness-v{self.version}")
        return model

    def tactics(self, base: Mapping[str, Tactic]) -> dict[str, Tactic]:
        """The tactic agent's table under this version: ``base`` with its macros, without disabled tactics."""
        return with_macros(base, self.macros, self.disabled_tactics)

    def expand(self, text: str) -> Expansion:
        """``text`` with this version's composite calls expanded (line for line)."""
        return expand(text, self.composites)

    def read(self, text: str) -> Program:
        """Parse a text that may call this version's composites (raises IRSyntaxError if it does not parse)."""
        exp = self.expand(text)
        if exp.diagnostics:
            raise IRSyntaxError(list(exp.diagnostics), "<ir>", text)
        return parse_program(exp.text)

    def write(self, program: Program) -> str:
        """The text of ``program`` with each occurrence of this version's composites written as a call."""
        return contract(program, self.composites)

    # ------------------------------------------------------------------ data

    def to_data(self) -> dict[str, Any]:
        return {"version": self.version, "parent": self.parent,
                "learned_rules": [r.to_data() for r in self.learned_rules],
                "composites": [c.to_data() for c in self.composites],
                "cost_eff": dict(self.cost_eff), "macros": [m.to_data() for m in self.macros],
                "disabled_tactics": list(self.disabled_tactics)}

    def to_json(self) -> str:
        return json.dumps(self.to_data(), indent=2)

    @staticmethod
    def from_json(text: str) -> "HarnessSpec":
        """Read a spec (also those written before composites and macros existed)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise HarnessDataError(f"a harness version is JSON; this one does not parse ({e})") from None
        if not isinstance(d, dict) or not isinstance(d.get("version"), int):
            raise HarnessDataError("a harness version is an object with an integer `version`")
        eff = d.get("cost_eff", {})
        if not (isinstance(eff, dict) and all(isinstance(v, (int, float)) and v > 0 for v in eff.values())):
            raise HarnessDataError(f"harness v{d['version']}: cost_eff maps op classes to positive factors")
        return HarnessSpec(
            d["version"], d.get("parent"),
            tuple(LearnedRule.from_data(r) for r in d.get("learned_rules", [])),
            tuple(Composite.from_data(c) for c in d.get("composites", [])),
            tuple(sorted((str(k), float(v)) for k, v in eff.items())),
            tuple(Macro.from_data(m) for m in d.get("macros", [])),
            tuple(d.get("disabled_tactics", [])))

    def apply(self, kind: str, payload: dict[str, Any], new_version: int) -> "HarnessSpec":
        """The spec after an approved proposal of ``kind`` with ``payload``; a payload that does not read
        as its kind raises HarnessDataError."""
        nxt = replace(self, version=new_version, parent=self.version)
        if kind == "rule":
            rule = LearnedRule.from_data(payload)
            if any(r.id == rule.id for r in self.learned_rules):
                raise HarnessDataError(f"harness v{self.version} already has a rule `{rule.id}`")
            return replace(nxt, learned_rules=self.learned_rules + (rule,))
        if kind == "primitive":
            comp = Composite.from_data(payload.get("composite"))
            if any(c.name == comp.name for c in self.composites):
                raise HarnessDataError(f"harness v{self.version} already has a composite `{comp.name}`")
            return replace(nxt, composites=self.composites + (comp,))
        if kind == "calibration":
            new = payload.get("eff")
            if not (isinstance(new, dict) and new and all(isinstance(v, (int, float)) and v > 0
                                                          for v in new.values())):
                raise HarnessDataError("a calibration payload maps op classes to positive factors under `eff`")
            eff = dict(self.cost_eff)
            eff.update({str(k): float(v) for k, v in new.items()})
            return replace(nxt, cost_eff=tuple(sorted(eff.items())))
        if kind == "tactic":
            if "macro" in payload:
                macro = Macro.from_data(payload["macro"])
                if any(m.name == macro.name for m in self.macros):
                    raise HarnessDataError(f"harness v{self.version} already has a macro `{macro.name}`")
                return replace(nxt, macros=self.macros + (macro,))
            disabled = set(self.disabled_tactics) | set(payload.get("disable", []))
            disabled -= set(payload.get("enable", []))
            return replace(nxt, disabled_tactics=tuple(sorted(disabled)))
        raise HarnessDataError(f"unknown proposal kind `{kind}`; kinds are {', '.join(KINDS)}")

    def export(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"harness-v{self.version}.json"
        path.write_text(self.to_json() + "\n")
        return path
