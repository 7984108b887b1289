"""Verifier rules of the distance-kernel ops on Hopper: the ``topk_bias`` fragment epilogue, ``topk_shift`` and
``sqnorm_rows`` (row norms of a landed smem tile). Family: wgmma (they live beside wgmma in roles).

Limits: KMAX (the kept list per row) is at most ``KMAX_LIMIT`` where the lists are rmem tiles: the lowering
keeps each thread's lists in registers, fully unrolled, and a longer list would spill to local memory. Lists
kept in one-stage smem tiles of the CTA (one sorted list per row, which the row's quad inserts into together) hold
up to ``KMAX_SMEM_LIMIT``.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator

from cake_core.ir.opdef import buffer_name
from cake_core.ir.ops import Node, Op
from cake_core.ir.types import DType, MemSpace
from cake_core.ir.rules_wgmma import fragment_dtype_checks, fragment_state_checks
from cake_core.ir.program import walk
from cake_core.ir.rules_operands import memory_operands
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, stages_of, view_extent
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

KMAX_LIMIT = 32
KMAX_SMEM_LIMIT = 128


def _nodes(ctx: Ctx, op: Op) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op is op:
            yield n, path


def _smem_slot(ctx: Ctx, name: str):
    """The type of an smem tile, or None."""
    t = ctx.buffers.get(name)
    if t is None or t.space is not MemSpace.SMEM:
        return None
    return t


@rule("topk_bias.acc", "wgmma", "topk_bias reads a wgmma accumulator of its own role and keeps its lists in rmem "
                                "tiles of that role or in one-stage smem tiles", guards=(Op.TOPK_BIAS,))
def _topk_bias_acc(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_state_checks(ctx, Op.TOPK_BIAS, "topk_bias.acc", ("top_v", "top_i"),
                                 "per-thread lists of the fragment rows, or one-stage smem tiles of the CTA",
                                 smem_state=True)


def kmax_limit(space: MemSpace) -> int:
    """The longest list topk_bias keeps per row in tiles of ``space``."""
    return KMAX_SMEM_LIMIT if space is MemSpace.SMEM else KMAX_LIMIT


@rule("topk_bias.shape", "wgmma", "topk_bias: dots (R, C), top_v and top_i (R, KMAX) with KMAX <= 32 in rmem or "
                                  "<= 128 in smem, both in one space, bias C values", guards=(Op.TOPK_BIAS,))
def _topk_bias_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _nodes(ctx, Op.TOPK_BIAS):
        dots = ctx.buffers.get(n.arg("dots"))
        if dots is None or dots.rank != 2:
            if dots is not None:
                yield ctx.diag("topk_bias.shape", n, f"dots `{n.arg('dots')}` is {fmt_shape(ctx, dots.shape)}; a 2-D "
                                                     "accumulator (rows, candidates) is needed", path=path)
            continue
        rows, cols = ctx.static(dots.shape[0]), ctx.static(dots.shape[1])
        shapes, spaces = [], set()
        for name in ("top_v", "top_i"):
            t = ctx.buffers.get(n.arg(name))
            if t is None:
                continue
            dims = [ctx.static(d) for d in t.shape]
            shapes.append(dims)
            spaces.add(t.space)
            top = kmax_limit(t.space)
            if len(dims) != 2 or dims[0] != rows or dims[1] is None or not 1 <= dims[1] <= top:
                yield ctx.diag("topk_bias.shape", n, f"{name} `{n.arg(name)}` is {t.space.value} "
                                                     f"{fmt_shape(ctx, t.shape)}; dots {fmt_shape(ctx, dots.shape)} "
                                                     f"needs ({rows}, KMAX), 1 <= KMAX <= {top} in {t.space.value}",
                               path=path, hint="one sorted list of KMAX (a static const >= k) per accumulator row; "
                                               f"up to {KMAX_LIMIT} in rmem, {KMAX_SMEM_LIMIT} in smem tiles")
        if len(spaces) > 1:
            yield ctx.diag("topk_bias.shape", n, "top_v and top_i are in different memory spaces", path=path,
                           hint="keep both lists in rmem (KMAX <= 32) or both in smem")
        if len(shapes) == 2 and shapes[0] != shapes[1]:
            yield ctx.diag("topk_bias.shape", n, f"top_v {tuple(shapes[0])} and top_i {tuple(shapes[1])} differ",
                           path=path, hint="allocate both as (BM, KMAX)")
        bias = ctx.buffers.get(n.arg("bias").buf)
        if bias is not None:
            vals = [ctx.static(d) for d in bias.shape]
            numel = None if None in vals else math.prod(vals)
            if numel != cols:
                yield ctx.diag("topk_bias.shape", n, f"bias `{n.arg('bias').buf}` holds {numel} values per slot; "
                                                     f"dots has {cols} columns", path=path,
                               hint=f"allocate the bias as smem(f32, ({cols},), stages=S)")


@rule("topk_bias.smem_init", "wgmma", "smem lists of topk_bias are filled in its role, then a role_sync, before the "
                                      "statement that runs it", guards=(Op.TOPK_BIAS,))
def _topk_bias_smem_init(ctx: Ctx) -> Iterable[Diagnostic]:
    """An smem list is written by the role's threads element by element (fill), but each row is read by the quad
    that owns it: every fill must be behind a role_sync before the first topk_bias reads the lists."""
    for n, path in _nodes(ctx, Op.TOPK_BIAS):
        role = ctx.role_of.get(id(n))
        names = [n.arg(x) for x in ("top_v", "top_i")]
        if role is None or not any((t := ctx.buffers.get(b)) is not None and t.space is MemSpace.SMEM for b in names):
            continue
        body = list(role.body)
        at = next((i for i, m in enumerate(body) if any(w[0] is n for w in walk((m,)))), None)
        for b in names:
            fills = [i for i, m in enumerate(body[:at]) if m.op is Op.FILL and m.args and m.args[0] == b]
            if not fills:
                yield ctx.diag("topk_bias.smem_init", n, f"smem list `{b}` is not filled in this role before "
                                                         "topk_bias", path=path,
                               hint=f"fill({b}, value={'inf' if b == names[0] else '-1.0'}) at the role's top, "
                                    "then role_sync()")
            elif not any(body[i].op is Op.ROLE_SYNC for i in range(fills[-1] + 1, at)):
                yield ctx.diag("topk_bias.smem_init", n, f"no role_sync between the fill of `{b}` and topk_bias: "
                                                         "a row's quad may read entries another warp has not "
                                                         "written yet", path=path,
                               hint="put role_sync() after the fills, before the loop")


# the ops that may name an smem list of topk_bias: its header keeps each row's pairs in an order of its own
# (cake_topk_smem.cuh, list_slot), which fill and topk_shift do not depend on and topk_publish undoes
LIST_OPS = (Op.FILL, Op.TOPK_BIAS, Op.TOPK_SHIFT, Op.TOPK_PUBLISH)


@rule("topk_bias.smem_private", "wgmma", "an smem list of topk_bias is named only by fill, topk_bias, topk_shift and "
                                         "topk_publish", guards=(Op.TOPK_BIAS,))
def _topk_bias_smem_private(ctx: Ctx) -> Iterable[Diagnostic]:
    """The lowering places each row's pairs by a swizzle of its own (a row's 4 lanes on 4 banks of their own), so an
    op that read or wrote a list by position would see its pairs out of order on the GPU, though the interpreter,
    which keeps them in order, agrees with it: such an op is refused, not miscompiled."""
    lists = {b for n, _ in _nodes(ctx, Op.TOPK_BIAS) for b in (n.arg("top_v"), n.arg("top_i"))
             if (t := ctx.buffers.get(b)) is not None and t.space is MemSpace.SMEM}
    if not lists:
        return
    for n, path, _ in ctx.nodes:
        if n.op in LIST_OPS:
            continue
        for _, a in memory_operands(n):
            if (name := buffer_name(a)) in lists:
                yield ctx.diag("topk_bias.smem_private", n, f"`{n.op.value}` names `{name}`, an smem list of "
                                                           "topk_bias, whose pairs are laid out for topk_bias alone",
                               path=path, hint="leave the lists to topk_shift and topk_publish (topk_cluster_merge "
                                               "then writes each row out in order), or keep them in registers")


@rule("topk_bias.dtype", "wgmma", "topk_bias keeps f32 values and i32 indices and reads an f32 bias",
      guards=(Op.TOPK_BIAS,))
def _topk_bias_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_dtype_checks(ctx, Op.TOPK_BIAS, "topk_bias.dtype", ("top_v", "top_i"),
                                 "compute the norms into an smem(f32, ...) tile (sqnorm_rows)")


@rule("sqnorm_rows.operands", "wgmma", "sqnorm_rows runs in a role: src an smem (R, C) 16-bit tile with rows of at "
                                       "most one swizzle span, dst an smem f32 slot of R values",
      guards=(Op.SQNORM_ROWS,))
def _sqnorm_rows_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _nodes(ctx, Op.SQNORM_ROWS):
        if ctx.role_of.get(id(n)) is None:
            yield ctx.diag("sqnorm_rows.operands", n, "sqnorm_rows outside a role", path=path,
                           hint="run it in the producer role after the wait on the tile's full barrier")
        src, dst = _smem_slot(ctx, n.arg("src").buf), _smem_slot(ctx, n.arg("dst").buf)
        if src is None or dst is None:
            yield ctx.diag("sqnorm_rows.operands", n, "src and dst must be smem tiles", path=path,
                           hint="src: the landed smem tile; dst: smem(f32, (R,), stages=S)")
            continue
        rows, cols = (ctx.static(d) for d in src.shape) if src.rank == 2 else (None, None)
        at = ctx.defined_at.get(n.arg("src").buf)
        span = at.attr("swizzle") if at is not None and "swizzle" in at.decl.attrs else 0
        if src.rank != 2 or src.dtype not in (DType.BF16, DType.F16) or (span and cols is not None
                                                                           and cols * 2 > span):
            yield ctx.diag("sqnorm_rows.operands", n, f"src `{n.arg('src').buf}` {src.dtype.value} "
                                                      f"{fmt_shape(ctx, src.shape)} (swizzle={span}): a 2-D bf16/f16 "
                                                      "tile whose rows fit one swizzle span is needed", path=path,
                           hint="call it once per (R, 64) K-block, accumulate=True after the first")
        dvals = [ctx.static(d) for d in dst.shape]
        if dst.dtype is not DType.F32 or len(dvals) != 1 or (rows is not None and dvals[0] != rows):
            yield ctx.diag("sqnorm_rows.operands", n, f"dst `{n.arg('dst').buf}` {dst.dtype.value} "
                                                      f"{fmt_shape(ctx, dst.shape)}: f32 ({rows},) needed", path=path,
                           hint=f"allocate it as smem(f32, ({rows},), stages=S)")


@rule("topk_shift.operands", "wgmma", "topk_shift adds an smem f32 vector of R values to the top_v list of a topk_bias "
                                     "of its own role", guards=(Op.TOPK_SHIFT,))
def _topk_shift_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    lists = {m.arg("top_v"): ctx.role_of.get(id(m)) for m, _ in _nodes(ctx, Op.TOPK_BIAS)}
    for n, path in _nodes(ctx, Op.TOPK_SHIFT):
        tv, role = n.arg("top_v"), ctx.role_of.get(id(n))
        if tv not in lists or role is None or lists[tv] is not role:
            yield ctx.diag("topk_shift.operands", n, f"`{tv}` is not the top_v list of a topk_bias in this role",
                           path=path, hint="shift the values list that topk_bias fills, inside its role, after its loop")
            continue
        rows = ctx.buffers.get(n.arg("rows").buf)
        t = ctx.buffers.get(tv)
        want = ctx.static(t.shape[0]) if t is not None and t.rank == 2 else None
        vals = [ctx.static(d) for d in rows.shape] if rows is not None else []
        numel = None if None in vals or not vals else math.prod(vals)
        if rows is None or rows.space is not MemSpace.SMEM or rows.dtype is not DType.F32 or numel != want:
            what = f"{rows.space.value}[{rows.dtype.value}] {fmt_shape(ctx, rows.shape)}" if rows is not None else "?"
            yield ctx.diag("topk_shift.operands", n, f"rows `{n.arg('rows').buf}` is {what}; an smem f32 slot of "
                                                     f"{want} values (one per row of `{tv}`) is needed", path=path,
                           hint=f"allocate it as smem(f32, ({want},)) and fill it with sqnorm_rows")


def _pub_shape(ctx: Ctx, n: Node) -> tuple[list | None, list[str]]:
    """The static (R, KMAX) of pub_v / pub_i and what is wrong with them (dtypes, spaces, stages, shapes)."""
    bad, shapes = [], []
    for name, dt in (("pub_v", DType.F32), ("pub_i", DType.I32)):
        b = n.arg(name)
        t = _smem_slot(ctx, b)
        if t is None:
            bad.append(f"{name} `{b}` is not an smem tile")
            continue
        dims = [ctx.static(d) for d in t.shape]
        shapes.append(dims)
        if t.dtype is not dt or len(dims) != 2 or stages_of(ctx, b) != 1:
            bad.append(f"{name} `{b}` is {t.dtype.value} {fmt_shape(ctx, t.shape)} with {stages_of(ctx, b)} stages; "
                       f"a one-stage {dt.value} (R, KMAX) tile is needed")
    if len(shapes) == 2 and shapes[0] != shapes[1]:
        bad.append(f"pub_v {tuple(shapes[0])} and pub_i {tuple(shapes[1])} differ")
    return (shapes[0] if shapes and not bad else None), bad


@rule("topk_publish.operands", "wgmma", "topk_publish runs in the role of a topk_bias, on its top_v / top_i lists, "
                                        "into one-stage smem tiles pub_v (f32) / pub_i (i32) of the lists' shape",
      guards=(Op.TOPK_PUBLISH,))
def _topk_publish_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    lists = {(m.arg("top_v"), m.arg("top_i")): ctx.role_of.get(id(m)) for m, _ in _nodes(ctx, Op.TOPK_BIAS)}
    for n, path in _nodes(ctx, Op.TOPK_PUBLISH):
        role, pair = ctx.role_of.get(id(n)), (n.arg("top_v"), n.arg("top_i"))
        if role is None or pair not in lists or lists[pair] is not role:
            yield ctx.diag("topk_publish.operands", n, f"`{pair[0]}` / `{pair[1]}` are not the top_v / top_i of a "
                                                       "topk_bias in this role", path=path,
                           hint="publish the lists inside the role that runs topk_bias, after its loop")
        shape, bad = _pub_shape(ctx, n)
        for msg in bad:
            yield ctx.diag("topk_publish.operands", n, msg, path=path,
                           hint="allocate pub_v = smem(f32, (BM, KMAX)) and pub_i = smem(i32, (BM, KMAX))")
        t = ctx.buffers.get(pair[0])
        if shape is not None and t is not None and [ctx.static(d) for d in t.shape] != shape:
            yield ctx.diag("topk_publish.operands", n, f"the lists are {fmt_shape(ctx, t.shape)}, pub_v "
                                                       f"{tuple(shape)}", path=path,
                           hint="give pub_v and pub_i the lists' shape (BM, KMAX)")


@rule("topk_cluster_merge.operands", "wgmma", "topk_cluster_merge runs at the top level, after the roles, on tiles "
                                              "a topk_publish wrote, into an (R, k <= KMAX) i32 or f32 window",
      guards=(Op.TOPK_CLUSTER_MERGE,))
def _topk_cluster_merge_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    published = {(m.arg("pub_v"), m.arg("pub_i")) for m, _ in _nodes(ctx, Op.TOPK_PUBLISH)}
    for n, path in _nodes(ctx, Op.TOPK_CLUSTER_MERGE):
        if ctx.role_of.get(id(n)) is not None or not any(m is n for m in ctx.program.body):
            yield ctx.diag("topk_cluster_merge.operands", n, "topk_cluster_merge inside a role or a block: every "
                                                             "thread of the CTA runs it", path=path,
                           hint="put it at the top level between two cluster_sync()")
        if (n.arg("pub_v"), n.arg("pub_i")) not in published:
            yield ctx.diag("topk_cluster_merge.operands", n, f"no topk_publish writes `{n.arg('pub_v')}` / "
                                                             f"`{n.arg('pub_i')}`", path=path,
                           hint="topk_publish(pub_v, pub_i, top_v, top_i) in the role, after its loop")
        shape, bad = _pub_shape(ctx, n)
        for msg in bad:
            yield ctx.diag("topk_cluster_merge.operands", n, msg, path=path,
                           hint="pass the tiles that topk_publish wrote")
        v = n.arg("dst")
        g, ext = ctx.buffers.get(v.buf), view_extent(ctx, v)
        if g is None:
            continue
        dims = [ctx.static(d) for d in ext] if ext is not None else []
        if g.dtype not in (DType.I32, DType.F32) or len(dims) != 2 or (shape is not None and (
                dims[0] != shape[0] or dims[1] is None or not 1 <= dims[1] <= shape[1])):
            yield ctx.diag("topk_cluster_merge.operands", n, f"dst `{v.buf}` {g.dtype.value} window "
                                                             f"{tuple(dims)}: an i32 (indices) or f32 (values) "
                                                             f"window of ({shape[0] if shape else 'R'}, k <= KMAX) "
                                                             "is needed", path=path,
                           hint="e.g. idx[tile(bid.x, BM), tile(0, KMAX)] (columns past k are skipped)")
