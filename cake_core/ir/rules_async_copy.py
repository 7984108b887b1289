"""Verifier rules for the async copies into smem slots: TMA (box, swizzle span, alignments, ``rows=``) and
``cp_async_bar`` (role, shape, swizzled layout).

The limits come from the target data (``cake_core.targets.Arch.tma``). :func:`copy_bytes`, the bytes a
tma_load lands, is also what ``rules_async``'s ``mbarrier.expect_tx`` adds up.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from cake_core.ir.expr import try_evaluate
from cake_core.ir.opdef import Family, Slot
from cake_core.ir.ops import REGISTRY, At, Node, Op, Tile, View
from cake_core.ir.registry import ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, view_extent
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

_TMA = frozenset(op for op in ops_of(Family.COPY)
                 if REGISTRY[op].engine == "tma" and any(o.kind == "slot" for o in REGISTRY[op].operands))


# ---------------------------------------------------------------------- TMA

def _tma_nodes(ctx: Ctx) -> Iterator[tuple[Node, str, View, Slot]]:
    """The TMA copies with their gmem box and their smem slot."""
    for n, path, _ in ctx.nodes:
        if n.op in _TMA:
            kinds = {o.kind: a for o, a in zip(REGISTRY[n.op].operands, n.args) if o.barrier is None}
            yield n, path, kinds["view"], kinds["slot"]


def _box(ctx: Ctx, v: View) -> list[int | None] | None:
    """Box dims in gmem order (single indices count as 1); None where not static."""
    t = ctx.buffers.get(v.buf)
    if t is None or len(v.index) != t.rank:
        return None
    out: list[int | None] = []
    for i, d in zip(v.index, t.shape):
        out.append(ctx.static(i.size) if isinstance(i, Tile) else 1 if isinstance(i, At) else ctx.static(d))
    return out


@rule("tma.box_dim", "tma", "a TMA box dimension exceeds the target's limit, or the box has too many dims",
      guards=_TMA)
def _tma_box_dim(ctx: Ctx) -> Iterable[Diagnostic]:
    lim, rank = ctx.target.tma.max_box_dim, ctx.target.tma.max_rank
    for n, path, v, _ in _tma_nodes(ctx):
        box = _box(ctx, v)
        if box is None:
            continue
        if len(box) > rank:
            yield ctx.diag("tma.box_dim", n, f"`{v.buf}` has rank {len(box)}; TMA takes at most {rank}", path=path)
        for b in box:
            if b is not None and b > lim:
                yield ctx.diag("tma.box_dim", n, f"box dimension {b} of `{v.buf}` exceeds {lim}", path=path,
                               hint=f"tile by at most {lim} per dimension (issue several boxes)")
                break


@rule("tma.swizzle_span", "tma", "the inner box bytes must fit the smem swizzle span (16 B multiple unswizzled)",
      guards=_TMA)
def _tma_swizzle(ctx: Ctx) -> Iterable[Diagnostic]:
    mult = ctx.target.tma.no_swizzle_inner_bytes_multiple
    # the smem tiles read as wgmma's b (N-major) or as an M-major a: a tma_load into one of those may be a whole
    # multiple of the span wide; it is lowered as inner / span boxes, one span-wide column block each, stacked in
    # smem (swizzle atoms side by side, which b's descriptor walks with its leading byte offset and an M-major a's
    # warpgroups take one each)
    wide_ok = {m.arg("b").buf for m, _, _ in ctx.nodes if m.op is Op.WGMMA} | \
        {m.arg("a").buf for m, _, _ in ctx.nodes if m.op is Op.WGMMA and m.attr("a_major") == "m"}
    for n, path, v, s in _tma_nodes(ctx):
        box, t, g = _box(ctx, v), ctx.buffers.get(s.buf), ctx.buffers.get(v.buf)
        if box is None or t is None or g is None or box[-1] is None:
            continue
        inner = box[-1] * g.dtype.bytes
        span = ctx.swizzle_of(s.buf)
        split = n.op is Op.TMA_LOAD and s.buf in wide_ok and span and inner % span == 0
        if span and inner > span and not split:
            yield ctx.diag("tma.swizzle_span", n, f"the inner box dimension is {inner} B, more than `{s.buf}`'s "
                                                  f"{span} B swizzle span", path=path,
                           hint=f"make the inner tile {span // g.dtype.bytes} elements wide, or split the box "
                                "(a tma_load into wgmma's b, or its M-major a, may be a whole multiple of the span "
                                "wide)")
        elif not span and inner % mult:
            yield ctx.diag("tma.swizzle_span", n, f"the inner box dimension is {inner} B; unswizzled TMA boxes "
                                                  f"need a multiple of {mult} B", path=path)


@rule("tma.global_align", "tma", "TMA needs the gmem tensor's strides 16-byte aligned", guards=_TMA)
def _tma_global_align(ctx: Ctx) -> Iterable[Diagnostic]:
    align = ctx.target.tma.global_align_bytes
    for n, path, v, _ in _tma_nodes(ctx):
        g = ctx.buffers.get(v.buf)
        if g is None:
            continue
        for k in range(1, g.rank):
            inner = ctx.static_numel(g.shape[k:])
            if inner is not None and inner * g.dtype.bytes % align:
                yield ctx.diag("tma.global_align", n, f"rows of `{v.buf}` are {inner * g.dtype.bytes} B apart; TMA "
                                                      f"needs strides that are multiples of {align} B", path=path,
                               hint="pad the tensor's inner dimension, or use load()/cp_async()")
                break
            if inner is None:      # symbolic: the run's shapes, when known, decide (with a witness)
                bad = next(((sh, st) for sh in ctx.shapes
                            if (st := _stride_bytes(ctx, g.shape[k:], g.dtype.bytes, sh)) is not None
                            and st % align), None)
                if bad is not None:
                    sh, st = bad
                    yield ctx.diag("tma.global_align", n, f"rows of `{v.buf}` are {st} B apart on a shape of this "
                                                          f"run; TMA needs strides that are multiples of {align} B",
                                   path=path, witness=[f"shape {', '.join(f'{a}={b}' for a, b in sh.items())}"],
                                   hint="run this kernel on shapes whose inner dimensions are multiples of "
                                        f"{align // g.dtype.bytes} elements, or use load()/cp_async()")
                    break


def _stride_bytes(ctx: Ctx, dims, nbytes: int, shape: dict[str, int]) -> int | None:
    env = {**shape, **ctx.consts}
    total = 1
    for d in dims:
        v = try_evaluate(d, env)
        if v is None:
            return None
        total *= int(v)
    return total * nbytes


@rule("tma.smem_align", "tma", "each smem slot a TMA copy writes must stay aligned (128 B; 1024 B with swizzle 128)",
      guards=_TMA)
def _tma_smem_align(ctx: Ctx) -> Iterable[Diagnostic]:
    tma = ctx.target.tma
    for n, path, _, s in _tma_nodes(ctx):
        t = ctx.buffers.get(s.buf)
        size = ctx.static_numel(t.shape) if t is not None else None
        if size is None:
            continue
        align = tma.swizzle_smem_align_bytes if ctx.swizzle_of(s.buf) == 128 else tma.smem_align_bytes
        if t.stages > 1 and size * t.dtype.bytes % align:
            yield ctx.diag("tma.smem_align", n, f"slots of `{s.buf}` are {size * t.dtype.bytes} B: slot 1 would start "
                                                f"off the {align} B alignment TMA needs", path=path,
                           hint=f"make one slot a multiple of {align} B")


def copy_bytes(ctx: Ctx, n: Node) -> int | None:
    """The bytes a tma_load lands: its slot's, or rows=R of its rows; None where not static."""
    t = ctx.buffers.get(n.arg("dst").buf)
    numel = ctx.static_numel(t.shape) if t is not None else None
    if not numel:
        return None
    rows = n.attr("rows")
    return (numel // ctx.static(t.shape[0]) * min(rows, ctx.static(t.shape[0])) if rows else numel) * t.dtype.bytes


@rule("tma.rows", "tma", "tma_load's rows= is a multiple of 8 below the slot's rows, on a rank-2 or higher slot, "
                         "without multicast", guards=(Op.TMA_LOAD,))
def _tma_rows(ctx: Ctx) -> Iterable[Diagnostic]:
    """rows=R copies the first R rows of the box into the slot's first R rows. A swizzled slot repeats its
    pattern every 8 rows, so R rows of a box land where the whole box would put them only for R a multiple of
    8; R below the slot's rows, since R equal to them is the whole box. A multicast box lands in peers whose
    barriers count whole boxes."""
    for n, path, _ in ctx.nodes:
        if n.op is not Op.TMA_LOAD or not n.attr("rows"):
            continue
        rows, t = n.attr("rows"), ctx.buffers.get(n.arg("dst").buf)
        first = ctx.static(t.shape[0]) if t is not None and t.rank >= 2 else None
        why = []
        if t is not None and t.rank < 2:
            why.append(f"rows={rows} on the rank-{t.rank} slot `{n.arg('dst').buf}`; rows cut the first "
                       "dimension of a rank-2 or higher slot")
        if rows < 0 or rows % 8:
            why.append(f"rows={rows} is not a positive multiple of 8 (the swizzle pattern repeats every 8 rows)")
        elif first is not None and rows >= first:
            why.append(f"rows={rows} is not below the slot's {first} rows (leave rows out to copy the whole box)")
        if n.attr("multicast"):
            why.append("rows with multicast: the peers' barriers expect whole boxes")
        for w in why:
            yield ctx.diag("tma.rows", n, w, path=path,
                           hint="rows=8 (or 16, ...) below the slot's rows, on a tma_load of this CTA only")


@rule("tma.box_shape", "tma", "the TMA box and the smem slot differ in shape", guards=_TMA)
def _tma_box_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, v, s in _tma_nodes(ctx):
        t, ext = ctx.buffers.get(s.buf), view_extent(ctx, v)
        if t is None or ext is None:
            continue
        a, b = ctx.static_numel(t.shape), ctx.static_numel(ext)
        if a is not None and b is not None and ([ctx.static(d) for d in t.shape] != [ctx.static(d) for d in ext]):
            yield ctx.diag("tma.box_shape", n, f"slot shape {fmt_shape(ctx, t.shape)} differs from the box "
                                               f"{fmt_shape(ctx, ext)} of `{v.buf}`", path=path,
                           hint="make the tile() sizes equal the smem tile's shape")


# ------------------------------------------------------------- cp_async_bar

def _cp_async_bars(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op is Op.CP_ASYNC_BAR:
            yield n, path


@rule("cp_async_bar.role", "async", "cp_async_bar runs inside a role (its threads synchronise before it returns)",
      guards=(Op.CP_ASYNC_BAR,))
def _cp_async_bar_role(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _cp_async_bars(ctx):
        if id(n) not in ctx.role_of:
            yield ctx.diag("cp_async_bar.role", n, "cp_async_bar outside a role: it ends with a barrier of the "
                                                   "role's threads, and its barrier is released by the role's "
                                                   "arrive", path=path,
                           hint="issue it from the producer role: with role(\"producer\", warps=(0, 4)):")


@rule("cp_async_bar.shape", "async", "cp_async_bar's window has the smem slot's shape and dtype",
      guards=(Op.CP_ASYNC_BAR,))
def _cp_async_bar_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _cp_async_bars(ctx):
        v: View = n.arg("src")
        t, g, ext = ctx.buffers.get(n.arg("dst").buf), ctx.buffers.get(v.buf), view_extent(ctx, v)
        if t is None or g is None or ext is None:
            continue
        if [ctx.static(d) for d in t.shape] != [ctx.static(d) for d in ext]:
            yield ctx.diag("cp_async_bar.shape", n, f"slot shape {fmt_shape(ctx, t.shape)} differs from the window "
                                                    f"{fmt_shape(ctx, ext)} of `{v.buf}`", path=path,
                           hint="make the tile() sizes equal the smem tile's shape")
        elif t.dtype is not g.dtype:
            yield ctx.diag("cp_async_bar.shape", n, f"`{v.buf}` is {g.dtype.value}, the slot "
                                                    f"`{n.arg('dst').buf}` is {t.dtype.value}: cp.async copies "
                                                    "bytes", path=path, hint=f"allocate the slot as {g.dtype.value}")


@rule("cp_async_bar.layout", "async", "a swizzled cp_async_bar slot has swizzle=128 and rows of one 128-byte span",
      guards=(Op.CP_ASYNC_BAR,))
def _cp_async_bar_layout(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _cp_async_bars(ctx):
        s = n.arg("dst")
        t, span = ctx.buffers.get(s.buf), ctx.swizzle_of(s.buf)
        if t is None or not span:
            continue
        row = ctx.static(t.shape[-1])
        if span != 128 or row is None or row * t.dtype.bytes != span:
            yield ctx.diag("cp_async_bar.layout", n, f"`{s.buf}` {fmt_shape(ctx, t.shape)} has swizzle={span}: "
                                                     "cp_async_bar writes swizzled tiles whose rows are one "
                                                     "128-byte span (wgmma's K-major operands)", path=path,
                           hint=f"allocate it as smem({t.dtype.value}, (rows, {128 // t.dtype.bytes}), swizzle=128) "
                                "and copy wider rows as several column tiles")
