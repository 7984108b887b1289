"""The op registry: one declaration per op, assembled in one place, and what the checkers derive from it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cake_core.ir import registry
from cake_core.ir.check import check_text
from cake_core.ir.opdef import Effect, Family, Op, Ordering
from cake_core.ir.registry import COMPUTE_OPS, DECLARATIONS, REGISTRY, SEMANTICS, _assemble, ops_of
from cake_core.problems import corpus_file



def test_every_op_is_declared_once_with_semantics_and_docs():
    assert [d.op for d in DECLARATIONS] and set(REGISTRY) == set(Op) and len(DECLARATIONS) == len(Op)
    for op, d in REGISTRY.items():
        assert callable(SEMANTICS[op]) and d.summary and d.example, op
        assert [o.keyword for o in d.operands] == sorted(o.keyword for o in d.operands), op


def test_a_second_declaration_or_a_missing_one_is_refused():
    with pytest.raises(AssertionError, match="`load` is declared twice"):
        _assemble(DECLARATIONS + (REGISTRY[Op.LOAD],))
    with pytest.raises(AssertionError, match="ops without a declaration: sync"):
        _assemble(tuple(d for d in DECLARATIONS if d.op is not Op.SYNC))
    bar = REGISTRY[Op.TMA_LOAD]
    first_kw = dataclasses.replace(bar, operands=bar.operands[2:] + bar.operands[:2])
    with pytest.raises(AssertionError, match="keyword operands come after"):
        _assemble(tuple(first_kw if d.op is Op.TMA_LOAD else d for d in DECLARATIONS))


def test_the_groups_are_families():
    assert ops_of(Family.AXIS) == {Op.REDUCE, Op.SCAN, Op.ARGMIN, Op.ARGMAX}
    assert ops_of(Family.RUNNING) == {Op.ARGMIN_UPDATE, Op.TOPK_MERGE}
    assert ops_of(Family.MMA) == {Op.MMA, Op.WGMMA, Op.TCGEN05_MMA}
    assert COMPUTE_OPS == {Op.FILL, Op.CAST, Op.UNARY, Op.EWISE, Op.SELECT, Op.IOTA, Op.TRANSPOSE, Op.TRISOLVE,
                           Op.REDUCE,
                           Op.SCAN, Op.ARGMIN, Op.ARGMAX, Op.ARGMIN_UPDATE, Op.TOPK_MERGE, Op.ATOMIC_ADD,
                           Op.SCATTER_ADD, Op.GATHER_ADD}


def test_an_effect_an_attribute_selects():
    from cake_core.ir.text import parse_program
    p = parse_program(corpus_file("kmeans_update_owned.cake").read_text())
    from cake_core.ir.program import walk
    scatter = next(n for n, _, _ in walk(p.body) if n.op is Op.SCATTER_ADD)
    assert REGISTRY[Op.SCATTER_ADD].operand("dst").effect_of(scatter) is Effect.OWNED_ADD
    assert REGISTRY[Op.SCATTER_ADD].operand("dst").effects == (Effect.ATOMIC_ADD, Effect.OWNED_ADD)


def _race_seed() -> str:
    # the gemm seed with the sync between the loads and the mma removed: a read-after-write race on a_s
    text = corpus_file("gemm_bf16.cake").read_text()
    return text.replace("        sync()\n        mma(acc, a_s, b_s)\n", "        mma(acc, a_s, b_s)\n")


def test_the_race_rule_follows_the_declared_ordering_and_effects(monkeypatch):
    assert any(d.rule == "races.smem" for d in check_text(_race_seed()))
    # declare mma's smem reads ordered by something else than sync(): the race rule stops following it
    from cake_core.ir import rules
    untracked = rules._TRACKED - {Op.MMA}
    monkeypatch.setattr(rules, "_TRACKED", untracked)
    assert not any(d.rule == "races.smem" for d in check_text(_race_seed()))


def test_the_race_rule_reads_effects_from_the_declaration(monkeypatch):
    from cake_core.ir import rules
    mma = REGISTRY[Op.MMA]
    no_reads = dataclasses.replace(mma, operands=tuple(dataclasses.replace(o, effect=Effect.NONE)
                                                       if o.name in ("a", "b") else o for o in mma.operands))
    patched = {**REGISTRY, Op.MMA: no_reads}
    monkeypatch.setattr(rules, "REGISTRY", patched)
    assert not any(d.rule == "races.smem" for d in check_text(_race_seed()))
    assert REGISTRY[Op.MMA].ordering is Ordering.BARRIER


def test_the_protocol_checker_reads_effects_from_the_declaration(monkeypatch):
    # the ws gemm with the full wait removed: the wgmma reads a slot before its copy landed; declare the
    # wgmma as reading nothing and the finding goes: the checker has no list of wgmma's operands of its own
    from cake_core.ir import protocol_state as protocol
    text = corpus_file("gemm_bf16_ws.cake").read_text().replace("            wait(full[kt % S], phase=kt // S % 2)\n", "")
    assert any(d.rule == "protocol.read_before_ready" for d in check_text(text))
    wg = REGISTRY[Op.WGMMA]
    blind = dataclasses.replace(wg, operands=tuple(dataclasses.replace(o, effect=Effect.NONE)
                                                   if o.name in ("a", "b") else o for o in wg.operands))
    monkeypatch.setattr(protocol, "REGISTRY", {**REGISTRY, Op.WGMMA: blind})
    protocol.plan_of.cache_clear()            # the checker works out each op's plan once
    try:
        assert not any(d.rule == "protocol.read_before_ready" for d in check_text(text))
    finally:
        monkeypatch.undo()
        protocol.plan_of.cache_clear()
    assert any(d.rule == "protocol.read_before_ready" for d in check_text(text))


def test_the_registry_module_is_the_only_place_ops_are_assembled():
    # no module registers ops or lowerings by being imported: the declaration modules hold plain tuples
    for mod in ("ops_core", "ops_async", "ops_compute"):
        m = __import__(f"cake_core.ir.{mod}", fromlist=["DECLS"])
        assert isinstance(m.DECLS, tuple) and all(d.op in REGISTRY for d in m.DECLS)
    assert registry.REGISTRY is REGISTRY
