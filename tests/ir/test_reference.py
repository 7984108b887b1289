"""docs/ops.md is the generated reference; it must match the registries it is generated from."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.ops import REGISTRY
from cake_core.ir.reference import RULE_OPS, render_reference, rules_for
from cake_core.ir.verify import RULES

DOC = Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def test_docs_ops_md_is_current():
    assert DOC.exists() and DOC.read_text() == render_reference(), \
        "docs/ops.md is stale: run `python -m cake_core.ir.reference > docs/ops.md`"


def test_every_op_and_rule_is_documented():
    text = render_reference()
    for op, d in REGISTRY.items():
        assert f"### `{op.value}`" in text
        assert d.summary and d.summary in text
    for rid in RULES:
        assert f"`{rid}`" in text


def test_rule_mapping_names_real_rules_and_ops():
    ops = {op.value for op in REGISTRY}
    for rid, names in RULE_OPS.items():
        assert rid in RULES, f"RULE_OPS names an unknown rule {rid}"
        assert set(names) <= ops, f"{rid} maps to unknown ops {set(names) - ops}"
    assert "mma.shape" in rules_for(next(op for op in REGISTRY if op.value == "mma"))
