"""docs/ops.md is the generated reference; it must match the registries it is generated from."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.ops import REGISTRY, Op
from cake_core.ir.reference import render_reference, rules_for
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
        assert f"## Family: {d.family.value}" in text
    for rid in RULES:
        assert f"`{rid}`" in text


def test_rules_name_the_ops_they_guard():
    # a rule's guards are declared with it: real ops, and the reference lists the rule under each
    for rid, r in RULES.items():
        assert r.guards <= set(REGISTRY), rid
        assert all(rid in rules_for(op) for op in r.guards)
    assert "mma.shape" in rules_for(Op.MMA) and "mma.shape" not in rules_for(Op.WGMMA)
    assert "tma.box_dim" in rules_for(Op.TMA_LOAD) and "tma.box_dim" not in rules_for(Op.CP_ASYNC)
    # the whole-program rules guard no op and stand under "General rules"
    general = render_reference().split("## General rules")[1]
    assert "`resources.threads`" in general and "`tma.box_dim`" not in general


def test_an_operand_shows_its_declared_effect_and_spaces():
    text = render_reference()
    load = text.split("### `load`")[1].split("### ")[0]
    assert "- `dst`: buf (write; smem/rmem)" in load and "- `src`: view (read; gmem)" in load
    tma = text.split("### `tma_load`")[1].split("### ")[0]
    assert "- `bar`: slot (written `name=...`) (an mbarrier: tma_load its copy's bytes complete a transaction " \
           "on it)" in tma
