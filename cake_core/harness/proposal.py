"""A proposed harness change: its kind, its definition (the payload a new version applies), its evidence.

``proposal_key`` is what makes two proposals the same change, whatever they are called and whichever
cluster or version they came from: a rule's condition, a composite's expansion, a calibration's factors
(to two significant digits), a macro's steps. A change whose key was already proposed (approved,
rejected or pending) is not proposed again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cake_core.harness.composite import Composite
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.macro import Macro
from cake_core.harness.predicate import Predicate
from cake_core.harness.version import KINDS


@dataclass
class Proposal:
    kind: str                       # rule | primitive | calibration | tactic
    signature: str                  # where it came from: a failure cluster, or the kind's own source
    title: str
    payload: dict[str, Any]         # what HarnessSpec.apply reads
    evidence: dict[str, Any] = field(default_factory=dict)     # JSON-able: definition, cluster, examples, gate

    @property
    def key(self) -> str:
        return proposal_key(self.kind, self.payload)


def proposal_key(kind: str, payload: dict[str, Any]) -> str:
    """The identity of the change a proposal makes; raises HarnessDataError for an unreadable payload."""
    if kind == "rule":
        return "rule:" + Predicate.from_data(payload.get("predicate")).key()
    if kind == "primitive":
        return "primitive:" + Composite.from_data(payload.get("composite")).key()
    if kind == "calibration":
        eff = payload.get("eff")
        if not isinstance(eff, dict) or not eff:
            raise HarnessDataError("a calibration payload maps factors to values under `eff`")
        return "calibration:" + json.dumps({k: float(f"{float(v):.2g}") for k, v in sorted(eff.items())})
    if kind == "tactic":
        if "macro" in payload:
            return "tactic:" + "+".join(Macro.from_data(payload["macro"]).steps)
        return "tactic:" + json.dumps({k: sorted(payload.get(k, [])) for k in ("disable", "enable")})
    raise HarnessDataError(f"unknown proposal kind `{kind}`; kinds are {', '.join(KINDS)}")
