"""Verifier rules of split-K over a cluster on Hopper: ``acc_publish`` (a wgmma accumulator into this CTA's
smem) and ``acc_cluster_reduce`` (the published tiles summed over the cluster through distributed shared
memory, stored once). Family: wgmma (acc_publish lives beside wgmma in roles).

The ordering (a ``cluster_sync()`` between publish and reduce, another before exit) is the protocol checker's
``protocol.cluster_read``; these rules check operands and placement.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from cake_core.ir.expr import symbols
from cake_core.ir.ops import At, Node, Op, Tile
from cake_core.ir.types import DType, MemSpace
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, view_extent
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

_BID = ("bid.x", "bid.y", "bid.z")


def _nodes(ctx: Ctx, op: Op) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op is op:
            yield n, path


def _mentions(n: Node, name: str) -> bool:
    """Whether an operand of ``n`` names the buffer ``name`` (a tile, a slot or a gmem view)."""
    return any(a == name or getattr(a, "buf", None) == name for a in n.args)


def _part_type(ctx: Ctx, name: str) -> tuple[list[int | None] | None, str | None]:
    """The static shape of the partial tile ``name`` and what is wrong with it (None when it is fine)."""
    t, at = ctx.buffers.get(name), ctx.defined_at.get(name)
    if t is None or t.space is not MemSpace.SMEM or at is None:
        return None, f"part `{name}` is not an smem tile"
    dims = [ctx.static(d) for d in t.shape]
    if t.dtype is not DType.F32 or len(dims) != 2 or at.attr("stages") != 1:
        return dims, (f"part `{name}` is {t.dtype.value} {fmt_shape(ctx, t.shape)} with {at.attr('stages')} "
                      "stages; a one-stage f32 (R, C) tile is needed")
    return dims, None


@rule("acc_publish.operands", "wgmma", "acc_publish runs in the role of the wgmma that accumulates acc, into a "
                                       "one-stage smem f32 tile of acc's shape that no other op touches",
      guards=(Op.ACC_PUBLISH,))
def _acc_publish_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    accs = {m.arg("acc"): ctx.role_of.get(id(m)) for m, _ in _nodes(ctx, Op.WGMMA)}
    for n, path in _nodes(ctx, Op.ACC_PUBLISH):
        role, acc, part = ctx.role_of.get(id(n)), n.arg("acc"), n.arg("part")
        if role is None or acc not in accs or accs[acc] is not role:
            yield ctx.diag("acc_publish.operands", n, f"`{acc}` is not the accumulator of a wgmma in this role",
                           path=path, hint="publish the wgmma accumulator in its role, after wgmma_wait(0)")
        dims, bad = _part_type(ctx, part)
        if bad:
            yield ctx.diag("acc_publish.operands", n, bad, path=path,
                           hint="allocate part = smem(f32, (BM, BN)) at the top level")
        t = ctx.buffers.get(acc)
        if not bad and t is not None and [ctx.static(d) for d in t.shape] != dims:
            yield ctx.diag("acc_publish.operands", n, f"part `{part}` is {tuple(dims)}, the accumulator "
                                                      f"{fmt_shape(ctx, t.shape)}", path=path,
                           hint="give part the accumulator's shape")
        for m, mpath, _ in ctx.nodes:
            if m.op not in (Op.ACC_PUBLISH, Op.ACC_CLUSTER_REDUCE) and m.result != part and _mentions(m, part):
                yield ctx.diag("acc_publish.operands", m, f"{m.op.value} touches `{part}`, which acc_publish lays "
                                                          "out for acc_cluster_reduce alone", path=mpath,
                               witness=[f"acc_publish at line {n.line}"],
                               hint="keep the partial tile private to acc_publish / acc_cluster_reduce")


@rule("acc_cluster_reduce.operands", "wgmma", "acc_cluster_reduce runs at the top level on a tile acc_publish "
                                              "wrote, into an f32 window of its shape that every CTA of the cluster "
                                              "shares", guards=(Op.ACC_CLUSTER_REDUCE,))
def _acc_cluster_reduce_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    published = {m.arg("part") for m, _ in _nodes(ctx, Op.ACC_PUBLISH)}
    cl = next((m for m in ctx.program.body if m.op is Op.CLUSTER), None)
    spans = [b for b, d in zip(_BID, cl.args[0] if cl is not None else ()) if ctx.static(d) != 1]
    for n, path in _nodes(ctx, Op.ACC_CLUSTER_REDUCE):
        part, v = n.arg("part"), n.arg("dst")
        if ctx.role_of.get(id(n)) is not None or not any(m is n for m in ctx.program.body):
            yield ctx.diag("acc_cluster_reduce.operands", n, "acc_cluster_reduce inside a role or a block: every "
                                                             "thread of the CTA runs it", path=path,
                           hint="put it at the top level between two cluster_sync()")
        if part not in published:
            yield ctx.diag("acc_cluster_reduce.operands", n, f"no acc_publish writes `{part}`", path=path,
                           hint="acc_publish(part, acc) in the wgmma role, after its loop")
        dims, bad = _part_type(ctx, part)
        if bad:
            yield ctx.diag("acc_cluster_reduce.operands", n, bad, path=path,
                           hint="pass the tile that acc_publish wrote")
        g, ext = ctx.buffers.get(v.buf), view_extent(ctx, v)
        if g is None:
            continue
        got = [ctx.static(d) for d in ext] if ext is not None else []
        if g.dtype is not DType.F32 or (not bad and got != dims):
            yield ctx.diag("acc_cluster_reduce.operands", n, f"dst `{v.buf}` {g.dtype.value} window {tuple(got)}: "
                                                             f"an f32 window of part's shape {tuple(dims or ())} "
                                                             "is needed", path=path,
                           hint="e.g. c[tile(bid.z, BM), tile(bid.x, BN)] for part (BM, BN)")
        used = set()
        for i in v.index:
            for e in (i.exprs() if isinstance(i, Tile) else (i.index,) if isinstance(i, At) else ()):
                used |= symbols(e)
        shared = sorted(used & set(spans))
        if shared:
            yield ctx.diag("acc_cluster_reduce.operands", n, f"the window of `{v.buf}` depends on {shared[0]}, "
                                                             "which differs between the CTAs of the cluster: they "
                                                             "must reduce into the same window", path=path,
                           hint="index the window by the bid coordinates the cluster does not span")
