"""Planted mistakes in a seed program: one edit (plus an optional rename) per rule, and the check that
the rule fires at the planted line with a hint and a path."""
from __future__ import annotations

from cake_core.ir.check import check_text


def plant(seed: str, planted: dict, renames: dict, rule_id: str) -> str:
    """``seed`` with ``planted[rule_id] = (old, new, line)`` applied once, then ``renames[rule_id]``."""
    old, new, _ = planted[rule_id]
    assert old in seed, old
    text = seed.replace(old, new, 1)
    if rule_id in renames:
        text = text.replace(*renames[rule_id])
    return text


def assert_fires_at_its_line(seed: str, planted: dict, renames: dict, rule_id: str) -> None:
    text = plant(seed, planted, renames, rule_id)
    diags = check_text(text, "planted.cake")
    hits = [d for d in diags if d.rule == rule_id]
    assert hits, f"{rule_id} did not fire; got {[d.rule for d in diags]}"
    assert hits[0].line == planted[rule_id][2], hits[0].format("planted.cake", text)
    assert hits[0].hint and hits[0].path
