"""Verifier rules for the async ops (roles, setmaxnreg, TMA, wgmma, mbarriers, clusters) and the protocol checker.

Every limit comes from the target data (``cake_core.targets.Arch``: ``setmaxnreg``,
``regs_per_sm``, ``tma``, ``wgmma``, ``max_cluster_size``, ``warpgroup_warps``,
``mma_atoms``). Families: role, setmaxnreg, control, tma, wgmma, mbarrier,
resources, async, protocol (``ir.protocol`` simulates the roles). The ops a rule
looks at come from their declarations: slot and barrier operands, the copy
engine, the MMA ops' completion, barrier uses, the ``multicast`` attribute.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, Bin, fmt_expr, substitute, symbols, try_evaluate
from cake_core.ir.intervals import bounds, loop_bounds
from cake_core.ir.opdef import Alloc, BarrierUse, Completion, Effect, Family, Proxy, Slot, SyncKind
from cake_core.ir.ops import REGISTRY, At, Node, Op, Tile, View
from cake_core.ir.protocol import RULE_IDS, check_protocol
from cake_core.ir.registry import ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, view_extent
from cake_core.ir.rules_let import bound_values
from cake_core.ir.types import DType, MemSpace
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

_SLOTS = {op: tuple(o for o in d.operands if o.kind == "slot") for op, d in REGISTRY.items()}
_SLOT_OPS = frozenset(op for op, s in _SLOTS.items() if s)
# the async copies: a gmem window to or from an smem slot (TMA, cp.async)
_ASYNC_COPIES = frozenset(op for op in ops_of(Family.COPY) if _SLOTS[op])
_TMA = frozenset(op for op in _ASYNC_COPIES if REGISTRY[op].engine == "tma")
# the MMAs a role issues asynchronously (wgmma, tcgen05): smem operands, a commit group retired by a wait
_ASYNC_MMAS = frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is Completion.MMA_GROUP)
_MULTICAST = frozenset(op for op, d in REGISTRY.items() if "multicast" in d.attrs)
_CTA_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CTA)
_CLUSTER_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CLUSTER)
_MBARRIERS = frozenset(op for op, d in REGISTRY.items() if d.allocates is Alloc.MBARRIER)


def _uses(use: BarrierUse) -> frozenset[Op]:
    """The ops with a barrier operand of this use."""
    return frozenset(op for op, d in REGISTRY.items() if any(o.barrier is use for o in d.operands))


def _barrier_operand(n: Node) -> tuple[BarrierUse, Slot] | None:
    """The barrier operand of ``n`` and what ``n`` does with it (None without one)."""
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.barrier is not None:
            return o.barrier, a
    return None


def _roles(ctx: Ctx) -> list[tuple[Node, str]]:
    return [(n, p) for n, p, _ in ctx.nodes if n.op is Op.ROLE]


def _barriers(ctx: Ctx) -> dict[str, Node]:
    return {n.result: n for n, _, _ in ctx.nodes if n.op in _MBARRIERS}


def _wgs(ctx: Ctx, n: Node) -> int:
    """Warpgroups that execute ``n`` (a partial warpgroup counts as one)."""
    return max(-(-ctx.threads_of(n) // ctx.target.warpgroup_threads), 1)


def _swizzle(ctx: Ctx, name: str) -> int:
    """The swizzle an smem tile was allocated with (0 for anything else)."""
    n = ctx.defined_at.get(name)
    return n.attr("swizzle") if n is not None and "swizzle" in REGISTRY[n.op].attrs else 0


def _numel(ctx: Ctx, shape) -> int | None:
    vals = [ctx.static(d) for d in shape]
    return None if None in vals else math.prod(vals)


def _cluster_size(ctx: Ctx) -> int:
    """CTAs per cluster (1 without a static cluster declaration)."""
    for n, _, _ in ctx.nodes:
        if n.op is Op.CLUSTER:
            dims = [ctx.static(d) for d in n.arg("dims")]
            return math.prod(dims) if None not in dims else 1
    return 1


def _blocks(nodes: tuple[Node, ...]) -> Iterator[tuple[Node, ...]]:
    yield nodes
    for n in nodes:
        if n.body:
            yield from _blocks(n.body)


# -------------------------------------------------------------------- roles

@rule("role.placement", "role", "roles sit at the kernel's top level and do not nest", guards=(Op.ROLE,))
def _role_placement(ctx: Ctx) -> Iterable[Diagnostic]:
    top = {id(n) for n in ctx.program.body}
    for n, path in _roles(ctx):
        if id(n) not in top:
            yield ctx.diag("role.placement", n, f"role `{n.args[0]}` is nested in another block", path=path,
                           hint="write the roles as sibling `with role(...)` blocks at the kernel's top level")


@rule("role.bounds", "role", "a role's warps must lie within the kernel's threads", guards=(Op.ROLE,))
def _role_bounds(ctx: Ctx) -> Iterable[Diagnostic]:
    warps = ctx.program.threads // ctx.target.warp_size
    for n, path in _roles(ctx):
        lo, hi = n.args[1]
        if not 0 <= lo < hi <= warps:
            yield ctx.diag("role.bounds", n, f"role `{n.args[0]}` takes warps [{lo}, {hi}), but threads="
                                             f"{ctx.program.threads} has warps [0, {warps})", path=path,
                           hint=f"raise threads to {max(hi, 1) * ctx.target.warp_size} or move the role's warps")


@rule("role.overlap", "role", "two roles claim the same warp", guards=(Op.ROLE,))
def _role_overlap(ctx: Ctx) -> Iterable[Diagnostic]:
    earlier: list[Node] = []
    for n, path in _roles(ctx):
        lo, hi = n.args[1]
        # warp ranges as intervals: a warp range may be huge (a typo), so warps are never enumerated
        clash = next((m for m in earlier if max(lo, m.args[1][0]) < min(hi, m.args[1][1])), None)
        if clash is not None:
            yield ctx.diag("role.overlap", n, f"role `{n.args[0]}` warps [{lo}, {hi}) overlap role "
                                              f"`{clash.args[0]}` warps {clash.args[1]}", path=path,
                           witness=[f"`{clash.args[0]}` declared at line {clash.line}"],
                           hint="give each role its own warps, e.g. warps=(0, 4) and warps=(4, 12)")
        earlier.append(n)


# --------------------------------------------------------------- setmaxnreg

@rule("setmaxnreg.value", "setmaxnreg", "a role's register budget is outside setmaxnreg's range or step",
      guards=(Op.ROLE,))
def _regs_value(ctx: Ctx) -> Iterable[Diagnostic]:
    lim = ctx.target.setmaxnreg
    for n, path in _roles(ctx):
        r = n.attr("regs")
        if r and not (lim.min <= r <= lim.max and r % lim.step == 0):
            yield ctx.diag("setmaxnreg.value", n, f"regs={r}: setmaxnreg takes {lim.min}..{lim.max} in steps "
                                                  f"of {lim.step}", path=path,
                           hint=f"use a multiple of {lim.step}, e.g. {max(lim.min, r - r % lim.step)}")


@rule("setmaxnreg.budget", "setmaxnreg", "the roles' register budgets exceed the register file", guards=(Op.ROLE,))
def _regs_budget(ctx: Ctx) -> Iterable[Diagnostic]:
    roles = _roles(ctx)
    if not any(n.attr("regs") for n, _ in roles):
        return
    total = sum(n.attr("regs") * ctx.threads_of(n.body[0] if n.body else n) for n, _ in roles if n.body)
    limit = ctx.target.regs_per_sm
    if total > limit:
        last = max((n for n, _ in roles if n.attr("regs")), key=lambda n: n.line)
        yield ctx.diag("setmaxnreg.budget", last, f"the roles ask for {total} registers (sum of regs * threads); "
                                                  f"the register file holds {limit}", path="kernel",
                       witness=[f"{n.args[0]}: {n.attr('regs')} x {ctx.threads_of(n.body[0])} threads"
                                for n, _ in roles if n.body],
                       hint="lower the producer's budget (24-40 is enough to issue TMA) or the consumers'")


# ------------------------------------------------------------------ control

@rule("control.sync_in_role", "control", "a CTA-wide barrier inside role-divergent code deadlocks",
      guards=_CTA_SYNCS)
def _sync_in_role(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op in _CTA_SYNCS and id(n) in ctx.role_of:
            yield ctx.diag("control.sync_in_role", n, f"sync() inside role `{ctx.role_of[id(n)].args[0]}`: the "
                                                      "other roles never reach it", path=path,
                           hint="synchronise roles through mbarriers (arrive/wait), or move sync() out of the role")


# ------------------------------------------------------------------ operands

@rule("async.operands", "async", "an mbarrier operand names a tile, or a tile operand names an mbarrier",
      guards=_SLOT_OPS)
def _async_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    """Undefined names are types.undefined's, memory spaces types.space's."""
    bars = _barriers(ctx)
    for n, path, _ in ctx.nodes:
        for o in _SLOTS[n.op]:
            s: Slot = n.arg(o.name)
            if o.barrier is not None and s.buf in ctx.buffers:
                yield ctx.diag("async.operands", n, f"`{n.op.value}` operand `{o.name}` must be an mbarrier; "
                                                    f"`{s.buf}` is a tile", path=path,
                               hint="allocate it with `bar = mbarrier(S, arrivals=1)`")
            elif o.barrier is None and s.buf in bars:
                yield ctx.diag("async.operands", n, f"`{n.op.value}` operand `{o.name}` must be an smem tile; "
                                                    f"`{s.buf}` is an mbarrier", path=path,
                               hint="allocate it with smem(..., stages=S) before this statement")


@rule("async.slot_index", "async", "a ring (stages > 1, or an mbarrier array) is used without a slot index that "
                                  "stays within its slots",
      guards=_SLOT_OPS)
def _slot_index(ctx: Ctx) -> Iterable[Diagnostic]:
    """A static index must name a slot; a symbolic one must stay within the slots for every shape and trip
    (``ir.intervals`` bounds it over the loop ranges, dims unbounded)."""
    bars = _barriers(ctx)
    ranges = loop_bounds(ctx.program, ctx.dims)
    for n, path, scope in ctx.nodes:
        for o in _SLOTS[n.op]:
            s: Slot = n.arg(o.name)
            if s.buf in bars:
                count = ctx.static(bars[s.buf].args[0])
            elif s.buf in ctx.buffers:
                count = ctx.buffers[s.buf].stages
            else:
                continue
            if s.index is None:
                if count is not None and count > 1:
                    yield ctx.diag("async.slot_index", n, f"`{s.buf}` has {count} slots; pick one: {s.buf}[i]",
                                   path=path, hint="index the ring with the trip, e.g. [kt % S]")
                continue
            bad = symbols(s.index) - set(ctx.consts) - ctx.dims - scope - set(CTA_COORDS) - set(CTA_COUNTS)
            v = ctx.static(s.index)
            reach = bounds(s.index, ranges[id(n)]) if count is not None and v is None and not bad else None
            if bad:
                yield ctx.diag("async.slot_index", n, f"slot index of `{s.buf}` uses undefined `{sorted(bad)[0]}`",
                               path=path, hint="index with loop variables and consts")
            elif v is not None and count is not None and not 0 <= v < count:
                yield ctx.diag("async.slot_index", n, f"slot {v} of `{s.buf}` is outside its {count} slots",
                               path=path, hint=f"use an index in [0, {count}), e.g. kt % {count}")
            elif reach is not None and (reach.hi is None or reach.hi >= count or reach.hi < 0):
                what = "grows without bound" if reach.hi is None else f"can reach {reach.hi}"
                yield ctx.diag("async.slot_index", n, f"slot index `{fmt_expr(s.index)}` of `{s.buf}` {what} "
                                                      f"(its values lie in {reach}), past its {count} slots",
                               path=path, witness=[f"{k} in {ranges[id(n)][k]}" for k in sorted(symbols(s.index))
                                                   if k in ranges[id(n)] and k not in ctx.consts],
                               hint=f"take the ring index modulo the slots: [(...) % {count}]")


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
    # the smem tiles read as wgmma's b (N-major): a tma_load into one of those may be a whole multiple of the
    # span wide; it is lowered as inner / span boxes, one span-wide column block each, stacked in smem
    # (swizzle atoms side by side, which the wgmma descriptor walks with its leading byte offset)
    wide_ok = {m.arg("b").buf for m, _, _ in ctx.nodes if m.op is Op.WGMMA}
    for n, path, v, s in _tma_nodes(ctx):
        box, t, g = _box(ctx, v), ctx.buffers.get(s.buf), ctx.buffers.get(v.buf)
        if box is None or t is None or g is None or box[-1] is None:
            continue
        inner = box[-1] * g.dtype.bytes
        span = _swizzle(ctx, s.buf)
        split = n.op is Op.TMA_LOAD and s.buf in wide_ok and span and inner % span == 0
        if span and inner > span and not split:
            yield ctx.diag("tma.swizzle_span", n, f"the inner box dimension is {inner} B, more than `{s.buf}`'s "
                                                  f"{span} B swizzle span", path=path,
                           hint=f"make the inner tile {span // g.dtype.bytes} elements wide, or split the box "
                                "(a tma_load into wgmma's b may be a whole multiple of the span wide)")
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
            inner = _numel(ctx, g.shape[k:])
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
        size = _numel(ctx, t.shape) if t is not None else None
        if size is None:
            continue
        align = tma.swizzle_smem_align_bytes if _swizzle(ctx, s.buf) == 128 else tma.smem_align_bytes
        if t.stages > 1 and size * t.dtype.bytes % align:
            yield ctx.diag("tma.smem_align", n, f"slots of `{s.buf}` are {size * t.dtype.bytes} B: slot 1 would start "
                                                f"off the {align} B alignment TMA needs", path=path,
                           hint=f"make one slot a multiple of {align} B")


def _copy_bytes(ctx: Ctx, n: Node) -> int | None:
    """The bytes a tma_load lands: its slot's, or rows=R of its rows; None where not static."""
    t = ctx.buffers.get(n.arg("dst").buf)
    numel = _numel(ctx, t.shape) if t is not None else None
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
        a, b = _numel(ctx, t.shape), _numel(ctx, ext)
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
        t, span = ctx.buffers.get(s.buf), _swizzle(ctx, s.buf)
        if t is None or not span:
            continue
        row = ctx.static(t.shape[-1])
        if span != 128 or row is None or row * t.dtype.bytes != span:
            yield ctx.diag("cp_async_bar.layout", n, f"`{s.buf}` {fmt_shape(ctx, t.shape)} has swizzle={span}: "
                                                     "cp_async_bar writes swizzled tiles whose rows are one "
                                                     "128-byte span (wgmma's K-major operands)", path=path,
                           hint=f"allocate it as smem({t.dtype.value}, (rows, {128 // t.dtype.bytes}), swizzle=128) "
                                "and copy wider rows as several column tiles")


# -------------------------------------------------------------------- wgmma

def _mmas(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op in _ASYNC_MMAS:
            yield n, path


@rule("async.atom_target", "async", "wgmma needs sm_90a; tcgen05_mma needs sm_100a", guards=_ASYNC_MMAS)
def _atom_target(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        atom = REGISTRY[n.op].atom_of(n)
        if atom not in ctx.target.mma_atoms:
            yield ctx.diag("async.atom_target", n, f"`{n.op.value}` does not exist on {ctx.target.arch}",
                           path=path, hint=f"atoms on {ctx.target.arch}: {', '.join(ctx.target.mma_atoms)}")


@rule("wgmma.role", "wgmma", "wgmma is issued by whole warpgroups that start at a warp index divisible by 4",
      guards=_ASYNC_MMAS)
def _wgmma_role(ctx: Ctx) -> Iterable[Diagnostic]:
    per = ctx.target.warpgroup_warps
    for n, path in _mmas(ctx):
        r = ctx.role_of.get(id(n))
        lo, hi = r.args[1] if r is not None else (0, ctx.program.threads // ctx.target.warp_size)
        if lo % per or (hi - lo) % per:
            who = f"role `{r.args[0]}` (warps [{lo}, {hi}))" if r is not None else f"threads={ctx.program.threads}"
            yield ctx.diag("wgmma.role", n, f"{n.op.value} issued by {who}: not whole warpgroups", path=path,
                           hint="give the MMA role warps=(4*i, 4*j)")


def _mma_tiles(ctx: Ctx, n: Node):
    acc = ctx.buffers.get(n.arg("acc"))
    a, b = ctx.buffers.get(n.arg("a").buf), ctx.buffers.get(n.arg("b").buf)
    return acc, a, b


def _b_kn(ctx: Ctx, n: Node, b) -> tuple[int | None, int | None]:
    """(K, N) of wgmma's b: (rows, columns) N-major, (columns, rows) with b_major="k"."""
    k, nn = ctx.static(b.shape[0]), ctx.static(b.shape[1])
    return (nn, k) if n.op is Op.WGMMA and n.attr("b_major") == "k" else (k, nn)


@rule("wgmma.acc", "wgmma", "the wgmma accumulator is an rmem f32 tile", guards=_ASYNC_MMAS)
def _wgmma_acc(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        acc = ctx.buffers.get(n.arg("acc"))
        if acc is not None and (acc.space is not MemSpace.RMEM or acc.dtype is not DType.F32 or acc.rank != 2):
            yield ctx.diag("wgmma.acc", n, f"accumulator `{n.arg('acc')}` is {acc}; wgmma accumulates into a 2-D "
                                           "rmem f32 tile", path=path, hint="allocate it as rmem(f32, (BM, BN))")


@rule("wgmma.m", "wgmma", "wgmma computes M = 64 rows per warpgroup", guards=_ASYNC_MMAS)
def _wgmma_m(ctx: Ctx) -> Iterable[Diagnostic]:
    if ctx.target.wgmma is None:
        return                  # no wgmma on this target: async.atom_target says so
    m = ctx.target.wgmma.m
    for n, path in _mmas(ctx):
        acc, a, _ = _mma_tiles(ctx, n)
        if acc is None or a is None or acc.rank != 2 or a.rank != 2:
            continue
        rows, arows, wgs = ctx.static(acc.shape[0]), ctx.static(a.shape[0]), _wgs(ctx, n)
        if rows != m * wgs or arows != rows:
            yield ctx.diag("wgmma.m", n, f"acc has {rows} rows and a has {arows}; {wgs} warpgroup(s) compute "
                                         f"{m * wgs} rows ({m} each)", path=path,
                           hint=f"use BM = {m} * warpgroups of the role")


@rule("wgmma.n", "wgmma", "wgmma's N is 8..256 in steps of 8, the same in acc and b", guards=_ASYNC_MMAS)
def _wgmma_n(ctx: Ctx) -> Iterable[Diagnostic]:
    w = ctx.target.wgmma
    if w is None:
        return
    for n, path in _mmas(ctx):
        acc, _, b = _mma_tiles(ctx, n)
        if acc is None or b is None or acc.rank != 2 or b.rank != 2:
            continue
        nn, bn = ctx.static(acc.shape[1]), _b_kn(ctx, n, b)[1]
        if nn is None:
            continue
        if not (w.n_min <= nn <= w.n_max and nn % w.n_step == 0) or bn != nn:
            kmaj = n.op is Op.WGMMA and n.attr("b_major") == "k"
            yield ctx.diag("wgmma.n", n, f"N = {nn} (b has {bn} {'rows' if kmaj else 'columns'}): wgmma takes N in "
                                         f"{w.n_min}..{w.n_max}, step {w.n_step}, equal in acc and b",
                           path=path, hint="pick BN among 64, 128, 256" + (
                               "; with b_major=\"k\" b is (BN, BK)" if kmaj else ""))


@rule("wgmma.k", "wgmma", "wgmma's K tile is a multiple of 16 (16-bit) or 32 (8-bit) and a and b agree",
      guards=_ASYNC_MMAS)
def _wgmma_k(ctx: Ctx) -> Iterable[Diagnostic]:
    w = ctx.target.wgmma
    if w is None:
        return
    for n, path in _mmas(ctx):
        _, a, b = _mma_tiles(ctx, n)
        if a is None or b is None or a.rank != 2 or b.rank != 2:
            continue
        k, bk = ctx.static(a.shape[1]), _b_kn(ctx, n, b)[0]
        step = w.k_8bit if a.dtype.bytes == 1 else w.k_16bit
        if k is None or k % step or bk != k:
            yield ctx.diag("wgmma.k", n, f"K = {k} (b has {bk} along K): wgmma steps K by {step} for "
                                         f"{a.dtype.value}; a and b must agree", path=path,
                           hint=f"use BK a multiple of {step}")


@rule("wgmma.operands", "wgmma", "wgmma's a and b live in smem, share a 16-bit (or 8-bit) dtype and a swizzle",
      guards=_ASYNC_MMAS)
def _wgmma_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        _, a, b = _mma_tiles(ctx, n)
        if a is None or b is None:
            continue
        if a.space is not MemSpace.SMEM or b.space is not MemSpace.SMEM:
            continue    # async.operands reports it
        if a.dtype != b.dtype or a.dtype not in (DType.BF16, DType.F16, DType.E4M3, DType.E5M2):
            yield ctx.diag("wgmma.operands", n, f"a is {a.dtype.value}, b is {b.dtype.value}: wgmma takes one "
                                                "16-bit (bf16/f16) or 8-bit float dtype", path=path,
                           hint="allocate both as bf16")
        elif _swizzle(ctx, n.arg("a").buf) != _swizzle(ctx, n.arg("b").buf):
            sa, sb = _swizzle(ctx, n.arg("a").buf), _swizzle(ctx, n.arg("b").buf)
            yield ctx.diag("wgmma.operands", n, f"a has swizzle={sa}, b has swizzle={sb}: "
                                                "the descriptors of one wgmma use one layout", path=path,
                           hint="allocate both with swizzle=128 (and load them with TMA of the same swizzle)")


@rule("wgmma.b_major", "wgmma", "a K-major b (b_major=\"k\") is an (N, K) smem tile with swizzle=128 rows of one "
                              "span, like a", guards=(Op.WGMMA,))
def _wgmma_b_major(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        if n.op is not Op.WGMMA or n.attr("b_major") != "k":
            continue
        _, _, b = _mma_tiles(ctx, n)
        if b is None or b.rank != 2 or b.space is not MemSpace.SMEM:
            continue
        span, row = _swizzle(ctx, n.arg("b").buf), ctx.static(b.shape[1])
        if span != 128 or row is None or row * b.dtype.bytes != span:
            yield ctx.diag("wgmma.b_major", n, f"b_major=\"k\" reads `{n.arg('b').buf}` {fmt_shape(ctx, b.shape)} "
                                               f"(swizzle={span}) as N rows of K: each row must be one 128-byte "
                                               "swizzle span", path=path,
                           hint=f"allocate b as smem({b.dtype.value}, (BN, {128 // b.dtype.bytes}), swizzle=128) and "
                                "split a wider K into several wgmma calls")


# ----------------------------------------------------------- fragment epilogues

def _epilogues(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op is Op.ARGMIN_BIAS:
            yield n, path


def fragment_state_checks(ctx: Ctx, op: Op, rule_id: str, state: tuple[str, str], what: str) -> Iterator[Diagnostic]:
    """A fused epilogue (argmin_bias, topk_bias) reads a wgmma accumulator of its own role and keeps its
    per-row ``state`` tiles (values, indices) in rmem tiles allocated in that role."""
    accs: dict[str, Node | None] = {}
    for m, _, _ in ctx.nodes:
        if m.op in _ASYNC_MMAS:
            accs[m.arg("acc")] = ctx.role_of.get(id(m))
    for n, path, _ in ctx.nodes:
        if n.op is not op:
            continue
        role = ctx.role_of.get(id(n))
        dots = n.arg("dots")
        if role is None or dots not in accs or accs[dots] is not role:
            yield ctx.diag(rule_id, n, f"`{dots}` is not the accumulator of a wgmma in this role",
                           path=path, hint="pass the wgmma accumulator itself (after wgmma_wait), not a copy")
        for name in state:
            b = n.arg(name)
            t, at = ctx.buffers.get(b), ctx.defined_at.get(b)
            if t is not None and (t.space is not MemSpace.RMEM or at is None or ctx.role_of.get(id(at)) is not role):
                yield ctx.diag(rule_id, n, f"{name} `{b}` must be an rmem tile allocated in the same role "
                                           f"({what})", path=path,
                               hint=f"allocate `{b}` with rmem(...) inside the role, before the loop")


def fragment_dtype_checks(ctx: Ctx, op: Op, rule_id: str, state: tuple[str, str],
                          bias_hint: str) -> Iterator[Diagnostic]:
    """A fused epilogue keeps f32 values and i32 indices, and reads an f32 accumulator and bias."""
    want = {state[0]: DType.F32, state[1]: DType.I32, "dots": DType.F32}
    for n, path, _ in ctx.nodes:
        if n.op is not op:
            continue
        for name, dt in want.items():
            t = ctx.buffers.get(n.arg(name))
            if t is not None and t.dtype is not dt:
                yield ctx.diag(rule_id, n, f"{name} `{n.arg(name)}` is {t.dtype.value}; {dt.value} needed",
                               path=path, hint=f"allocate it as {dt.value}")
        t = ctx.buffers.get(n.arg("bias").buf)
        if t is not None and t.dtype is not DType.F32:
            yield ctx.diag(rule_id, n, f"bias `{n.arg('bias').buf}` is {t.dtype.value}; f32 needed",
                           path=path, hint=bias_hint)


@rule("argmin_bias.acc", "wgmma", "argmin_bias reads a wgmma accumulator of its own role and keeps row state in rmem "
                                  "tiles of that role", guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_acc(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_state_checks(ctx, Op.ARGMIN_BIAS, "argmin_bias.acc", ("best", "arg"),
                                 "it is per-thread row state of the fragment")


@rule("argmin_bias.shape", "wgmma", "argmin_bias: dots (R, C), best and arg (R,) or (R, 1), bias C values",
      guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _epilogues(ctx):
        dots, bias = ctx.buffers.get(n.arg("dots")), ctx.buffers.get(n.arg("bias").buf)
        if dots is None or dots.rank != 2:
            if dots is not None:
                yield ctx.diag("argmin_bias.shape", n, f"dots `{n.arg('dots')}` is {fmt_shape(ctx, dots.shape)}; "
                                                       "a 2-D accumulator (rows, candidates) is needed", path=path)
            continue
        rows, cols = ctx.static(dots.shape[0]), ctx.static(dots.shape[1])
        for name in ("best", "arg"):
            t = ctx.buffers.get(n.arg(name))
            if t is not None and [ctx.static(d) for d in t.shape] not in ([rows], [rows, 1]):
                yield ctx.diag("argmin_bias.shape", n, f"{name} `{n.arg(name)}` is {fmt_shape(ctx, t.shape)}; dots "
                                                       f"{fmt_shape(ctx, dots.shape)} needs ({rows},)", path=path,
                               hint="one running entry per row of the accumulator")
        if bias is not None and _numel(ctx, bias.shape) != cols:
            yield ctx.diag("argmin_bias.shape", n, f"bias `{n.arg('bias').buf}` holds {_numel(ctx, bias.shape)} "
                                                   f"values per slot; dots has {cols} columns", path=path,
                           hint=f"allocate the bias as smem(f32, ({cols},), stages=S)")


@rule("argmin_bias.dtype", "wgmma", "argmin_bias keeps f32 values and i32 indices and reads an f32 bias",
      guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_dtype_checks(ctx, Op.ARGMIN_BIAS, "argmin_bias.dtype", ("best", "arg"),
                                 "load the per-column values into an smem(f32, ...) tile")


# ----------------------------------------------------------------- mbarrier

_SIGNALS = (BarrierUse.ARRIVE, BarrierUse.EXPECT_TX, BarrierUse.COMPLETE_TX)    # what completes a phase


@rule("mbarrier.phase", "mbarrier", "a wait must name a reachable phase parity of a barrier that is arrived at",
      guards=_uses(BarrierUse.WAIT))
def _mbarrier_phase(ctx: Ctx) -> Iterable[Diagnostic]:
    signalled = set()
    for n, _, _ in ctx.nodes:
        b = _barrier_operand(n)
        if b is not None and b[0] in _SIGNALS:
            signalled.add(b[1].buf)
    for n, path, _ in ctx.nodes:
        b = _barrier_operand(n)
        if b is None or b[0] is not BarrierUse.WAIT:
            continue
        p, bar = substitute(n.arg("phase"), bound_values(ctx)[id(n)]), b[1].buf   # through bindings
        parity = isinstance(p, int) and p in (0, 1) or isinstance(p, Bin) and p.op == "%" and p.b == 2
        if not parity:
            yield ctx.diag("mbarrier.phase", n, "the phase of a wait is a parity (0 or 1): completed phases are "
                                                "only told apart modulo 2", path=path,
                           hint="write phase=(kt // S) % 2 for a ring of S slots")
        elif bar in _barriers(ctx) and bar not in signalled:
            yield ctx.diag("mbarrier.phase", n, f"nothing arrives on `{bar}`: this wait's phase never completes",
                           path=path, hint=f"arrive(...) or expect_tx(...) on `{bar}` in the role that releases it")


@rule("mbarrier.arrivals", "mbarrier", "a barrier's arrival count must match the arrivals made per phase",
      guards=_MBARRIERS | _uses(BarrierUse.ARRIVE) | _uses(BarrierUse.EXPECT_TX))
def _mbarrier_arrivals(ctx: Ctx) -> Iterable[Diagnostic]:
    """Arrivals per phase: every role arrives each phase, so roles add up; within a role, arrive sites in
    one block add up, while sites in different blocks are alternatives (a persistent consumer releases a
    ring slot inside its k-loop, and the tile's last slot after it), so the role counts its largest block."""
    made: dict[str, list[str]] = {}
    per_block: dict[str, dict[tuple[str, str], int]] = {}
    for n, path, _ in ctx.nodes:
        b = _barrier_operand(n)
        if b is not None and b[0] in (BarrierUse.ARRIVE, BarrierUse.EXPECT_TX):
            k = 1 if b[0] is BarrierUse.EXPECT_TX else _wgs(ctx, n)
            if n.op in _MULTICAST and n.attr("multicast"):
                k *= _cluster_size(ctx)   # every CTA of the cluster arrives on each barrier of the mask
            name = b[1].buf
            who = ctx.role_of[id(n)].args[0] if id(n) in ctx.role_of else "cta"
            block = (who, path.rsplit(".", 1)[0] if "." in path else "")
            per_block.setdefault(name, {})[block] = per_block.get(name, {}).get(block, 0) + k
            made.setdefault(name, []).append(f"{n.op.value} at line {n.line} ({who}): {k} arrival(s)")
    count: dict[str, int] = {}
    for name, blocks in per_block.items():
        by_role: dict[str, int] = {}
        for (who, _), k in blocks.items():
            by_role[who] = max(by_role.get(who, 0), k)
        count[name] = sum(by_role.values())
    for name, n in _barriers(ctx).items():
        if name in count and count[name] != n.attr("arrivals"):
            yield ctx.diag("mbarrier.arrivals", n, f"`{name}` expects {n.attr('arrivals')} arrival(s) per phase; "
                                                   f"the program makes {count[name]}",
                           path=next(p for m, p, _ in ctx.nodes if m is n), witness=made[name],
                           hint=f"set arrivals={count[name]} (arrive counts one per warpgroup of its role; "
                                "expect_tx counts one)")


@rule("mbarrier.expect_tx", "mbarrier", "expect_tx bytes must equal the bytes of the TMA boxes that signal the barrier",
      guards=_uses(BarrierUse.EXPECT_TX) | _uses(BarrierUse.COMPLETE_TX))
def _mbarrier_expect_tx(ctx: Ctx) -> Iterable[Diagnostic]:
    landing = _uses(BarrierUse.COMPLETE_TX)
    for block in _blocks(ctx.program.body):
        for n in block:
            b = _barrier_operand(n)
            if b is None or b[0] is not BarrierUse.EXPECT_TX:
                continue
            loads = [m for m in block if m.op in landing and _barrier_operand(m)[1] == b[1]]
            if any(m.op in landing and m.op in _MULTICAST and m.attr("multicast") for m in _nested(block)):
                continue    # peers' multicast boxes land here too: the protocol checker counts them per CTA
            sizes = [_copy_bytes(ctx, m) for m in loads]
            want, got = ctx.static(n.arg("bytes")), sum(s for s in sizes if s is not None)
            if not loads or None in sizes or want is None or want == got:
                continue
            yield ctx.diag("mbarrier.expect_tx", n, f"expect_tx announces {want} B, the TMA copies signalling "
                                                    f"`{b[1].buf}` here land {got} B",
                           path=next(p for m, p, _ in ctx.nodes if m is n),
                           witness=[f"tma_load at line {m.line}: {s} B" for m, s in zip(loads, sizes)],
                           hint=f"expect_tx {got} B (whole boxes count, or their first rows=R rows; zero-filled edges included)")


# --------------------------------------------------------------- resources

@rule("resources.cluster", "resources", "the cluster holds at most the target's max CTAs; multicast fits the cluster",
      guards=_MULTICAST | {Op.CLUSTER})
def _cluster(ctx: Ctx) -> Iterable[Diagnostic]:
    size = 1
    for n, path, _ in ctx.nodes:
        if n.op is Op.CLUSTER:
            dims = [ctx.static(d) for d in n.arg("dims")]
            if None in dims or len(dims) > 3:
                yield ctx.diag("resources.cluster", n, "the cluster shape is 1 to 3 static dims", path=path)
                continue
            size = math.prod(dims)
            if size > ctx.target.max_cluster_size:
                yield ctx.diag("resources.cluster", n, f"a cluster of {size} CTAs; {ctx.target.arch} allows "
                                                       f"{ctx.target.max_cluster_size}", path=path,
                               hint="use at most 8 CTAs per cluster (2 or 4 is usual)")
    for n, path, _ in ctx.nodes:
        if n.op in _MULTICAST and n.attr("multicast") >> size:
            yield ctx.diag("resources.cluster", n, f"multicast mask {n.attr('multicast'):#x} names CTAs beyond the "
                                                   f"cluster of {size}", path=path,
                           hint="declare cluster((n, 1, 1)) first, and use a mask below 1 << n")


@rule("cluster.sync", "resources", "a kernel that writes into other CTAs of its cluster synchronises the cluster "
                                   "after its mbarriers are initialised and again before it exits",
      guards=_MULTICAST | _CLUSTER_SYNCS)
def _cluster_sync(ctx: Ctx) -> Iterable[Diagnostic]:
    remote = [(n, p) for n, p, _ in ctx.nodes if n.op in _MULTICAST and n.attr("multicast")]
    if not remote:
        return
    body = ctx.program.body
    roles = [i for i, n in enumerate(body) if n.op is Op.ROLE]
    first_remote = min((i for i, n in enumerate(body) if any(m is r for m, _, _ in _walk_one(n) for r, _ in remote)),
                       default=len(body))
    last_bar = max((i for i, n in enumerate(body) if n.op in _MBARRIERS), default=-1)
    syncs = [i for i, n in enumerate(body) if n.op in _CLUSTER_SYNCS]
    end = (roles[-1] if roles else first_remote)
    if not any(last_bar < i < first_remote for i in syncs):
        n, path = remote[0]
        yield ctx.diag("cluster.sync", n, f"`{n.op.value}` writes into other CTAs of the cluster, but no "
                                          "cluster_sync() separates it from their mbarrier initialisation",
                       path=path, hint="put cluster_sync() at the top level after the mbarrier allocations, "
                                       "before the roles")
    if not any(i > end for i in syncs):
        n, path = remote[-1]
        yield ctx.diag("cluster.sync", n, f"`{n.op.value}` writes into other CTAs of the cluster, but the kernel "
                                          "may exit before they do: no cluster_sync() after the roles",
                       path=path, hint="end the kernel with cluster_sync() at the top level, after the roles")


def _nested(nodes: tuple[Node, ...]) -> Iterator[Node]:
    for n in nodes:
        yield n
        yield from _nested(n.body)


def _walk_one(n: Node):
    """``n`` and every node nested in it."""
    yield n, "", frozenset()
    for m in n.body:
        yield from _walk_one(m)


# ----------------------------------------------------------------- protocol

def _protocol(ctx: Ctx) -> list[Diagnostic]:
    found = ctx.__dict__.get("_protocol")
    if found is None:
        found = ctx.__dict__["_protocol"] = check_protocol(ctx)
    return found


def _protocol_rule(rule_id: str, summary: str, guards: frozenset[Op]) -> None:
    @rule(rule_id, "protocol", summary, guards=guards)
    def _check(ctx: Ctx) -> Iterable[Diagnostic]:
        return [d for d in _protocol(ctx) if d.rule == rule_id]


def _smem_side(effect_test: Callable[[Effect], bool]) -> frozenset[Op]:
    """The ops with a slot or smem-tile operand whose declared effect passes ``effect_test``."""
    return frozenset(op for op, d in REGISTRY.items() for o in d.operands
                     if o.memory and MemSpace.SMEM in o.space and o.kind != "view" and not o.cluster
                     and any(effect_test(e) for e in o.effects))


_READERS = _smem_side(lambda e: e.reads)
for _id, _summary, _guards in zip(RULE_IDS, (
        "every role is blocked on a barrier phase that never completes",
        "a barrier's expected transaction bytes differ from the bytes its copies land",
        "a role reads an smem slot before waiting for the copy that fills it",
        "a copy overwrites an smem slot before its readers released it",
        "a read of a cluster CTA's smem is not ordered after its write, or before its exit, by cluster_sync()",
        "a wgmma reads a slot filled by generic-proxy copies without a fence_async after its wait",
        "the protocol checker could not decide the kernel (its step budget spent, or an op it cannot simulate)",
        "an op reads a wgmma accumulator before a wgmma_wait covers the wgmma that writes it",
        "a ring slot or mbarrier index falls outside its slots at some trip of the simulated launches"), (
        _uses(BarrierUse.WAIT),
        _uses(BarrierUse.EXPECT_TX) | _uses(BarrierUse.COMPLETE_TX),
        _READERS,
        _smem_side(lambda e: e.writes),
        frozenset(op for op, d in REGISTRY.items() if any(o.cluster for o in d.operands)),
        frozenset(op for op in _READERS if REGISTRY[op].proxy is Proxy.ASYNC),
        frozenset(),
        frozenset(op for op, d in REGISTRY.items()
                  if any(o.kind == "buf" and MemSpace.RMEM in o.space and o.effect is Effect.READ for o in d.operands)
                  and d.completion is not Completion.MMA_GROUP),
        frozenset(_SLOT_OPS))):
    _protocol_rule(_id, _summary, _guards)
