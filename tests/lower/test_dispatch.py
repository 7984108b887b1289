"""The lowering dispatch: one entry per op, named variants chosen by predicates in one table."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.ops import REGISTRY, Op
from cake_core.ir.program import walk
from cake_core.ir.text import parse_program
from cake_core.lower import lower
from cake_core.lower.context import Buf, Ctx
from cake_core.lower.dispatch import LOWERINGS, Dispatch
from cake_core.outcome import Outcome
from cake_core.targets import get_arch
from cake_core.problems import corpus_file



def test_every_op_has_one_dispatch_entry_with_uniquely_named_variants():
    assert set(LOWERINGS) == set(REGISTRY)
    for op, d in LOWERINGS.items():
        assert isinstance(d, Dispatch), op
        names = [v.name for v in d.variants]
        assert len(names) == len(set(names)), op


def _chosen(text: str) -> dict[tuple[Op, int], str]:
    """(op, IR line) -> the name of the variant that lowered it."""
    seen: dict[tuple[Op, int], str] = {}
    original = {op: d.variant_for for op, d in LOWERINGS.items()}

    def spy(op):
        def pick(n, ctx):
            v = original[op](n, ctx)
            seen[(op, n.line)] = v.name
            return v
        return pick

    for op, d in LOWERINGS.items():
        object.__setattr__(d, "variant_for", spy(op))
    try:
        assert lower(parse_program(text)).outcome is Outcome.OK
    finally:
        for op, d in LOWERINGS.items():
            object.__delattr__(d, "variant_for")
    return seen


def _at(name: str, needle: str) -> tuple[str, int]:
    text = corpus_file(f"{name}.cake").read_text()
    return text, next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_the_variants_chosen_for_warp_specialized_kernels():
    text, acc = _at("gemm_bf16_ws", "acc = rmem(")
    store = next(i for i, ln in enumerate(text.splitlines(), 1) if "store(" in ln)
    seen = _chosen(text)
    assert seen[(Op.RMEM, acc)] == "wgmma_accumulator" and seen[(Op.STORE, store)] == "wgmma_accumulator"
    text, best = _at("kmeans_assign_ws", "best = rmem(")
    seen = _chosen(text)
    assert seen[(Op.RMEM, best)] == "argmin_bias_row_state"
    assert "argmin_bias_row_state" in {v for (op, _), v in seen.items() if op is Op.STORE}
    text, top = _at("knn_topk_ws", "top_v = rmem(")
    assert _chosen(text)[(Op.RMEM, top)] == "topk_bias_lists"
    text, add = _at("tinygemm_splitk", "atomic_add(")
    assert _chosen(text)[(Op.ATOMIC_ADD, add)] == "wgmma_accumulator"


def test_the_variants_chosen_for_a_cta_wide_kernel():
    text, acc = _at("gemm_bf16", "acc = rmem(")
    mma = next(i for i, ln in enumerate(text.splitlines(), 1) if "mma(" in ln)
    seen = _chosen(text)
    assert seen[(Op.RMEM, acc)] == "cta" and seen[(Op.MMA, mma)] == "fma"
    sync_text = text.replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')
    assert _chosen(sync_text)[(Op.MMA, mma)] == "mma_sync"


def test_an_op_outside_its_variants_domain_is_refused_by_its_named_variant():
    # load inside a role: the in-role variant refuses it (the v1 helper spreads over all the CTA's threads)
    text = corpus_file("gemm_bf16_ws.cake").read_text().replace(
        "    full = mbarrier(S)\n", "    t_s = smem(bf16, (BM, BK))\n    full = mbarrier(S)\n").replace(
        "        acc = rmem(f32, (BM, BN))\n", "        acc = rmem(f32, (BM, BN))\n        load(t_s, a[tile(bid.y, BM), tile(0, BK)])\n")
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert [d.rule for d in r.diagnostics] == ["lower.unsupported_in_role"]
    mma = parse_program(corpus_file("gemm_bf16.cake").read_text().replace("mma(acc, a_s, b_s)",
                                                                        'mma(acc, a_s, b_s, atom="wgmma")'))
    r = lower(mma)
    assert [d.rule for d in r.diagnostics] == ["lower.unsupported_atom"]


def test_a_variant_table_with_no_applicable_variant_says_so():
    from cake_core.lower.dispatch import Variant
    prog = parse_program(corpus_file("gemm_bf16.cake").read_text())
    ctx = Ctx(prog, "k.cake", ("M", "K", "N"), {q.name: Buf(q.name, q.type, ()) for q in prog.params},
              get_arch("sm_90a"), LOWERINGS)
    never = Dispatch((Variant("never", lambda n, c: False, lambda n, c: []),), fragment_aware=True)
    node = next(n for n, _, _ in walk(prog.body) if n.op is Op.SYNC)
    try:
        never(node, ctx)
    except Exception as e:          # noqa: BLE001 - a LowerError becomes the node's diagnostic
        assert getattr(e, "rule", None) == "lower.unknown_op" and "variants: never" in str(e)
    else:
        raise AssertionError("no variant applied, yet the dispatch lowered the node")
