"""Verifier rules for warp-specialised kernels: roles, setmaxnreg, slots, mbarriers, clusters, and the protocol checker.

Every limit comes from the target data (``cake_core.targets.Arch``: ``setmaxnreg``, ``regs_per_sm``,
``max_cluster_size``, ``warpgroup_threads``). Families: role, setmaxnreg, control, async, mbarrier,
resources, protocol (``ir.protocol`` simulates the roles). The ops a rule looks at come from their
declarations: slot and barrier operands, barrier uses, the ``multicast`` attribute, the MMA ops'
completion. The rules of the async copies (TMA, cp_async_bar) are in ``rules_async_copy``, those of the
asynchronous MMAs and their fused epilogues in ``rules_wgmma``.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, Bin, fmt_expr, substitute, symbols
from cake_core.ir.intervals import bounds, loop_bounds
from cake_core.ir.opdef import Alloc, BarrierUse, Completion, Effect, Exchange, Family, Proxy, Slot, SyncKind
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.fragments import epilogue_state
from cake_core.ir.protocol import RULE_IDS, check_protocol
from cake_core.ir.registry import COMPUTE_OPS, ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, layouts
from cake_core.ir.rules_async_copy import copy_bytes
from cake_core.ir.rules_let import bound_values
from cake_core.ir.types import MemSpace
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

_SLOTS = {op: tuple(o for o in d.operands if o.kind == "slot") for op, d in REGISTRY.items()}
_SLOT_OPS = frozenset(op for op, s in _SLOTS.items() if s)
_MULTICAST = frozenset(op for op, d in REGISTRY.items() if "multicast" in d.attrs)
_CTA_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CTA)
_CLUSTER_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CLUSTER)
_MBARRIERS = frozenset(op for op, d in REGISTRY.items() if d.allocates is Alloc.MBARRIER)
_ASYNC_MMAS = frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is Completion.MMA_GROUP)
# compute ops a role runs over its own threads (lower/thread_map.py): elementwise, no element changes thread
_ROLE_COMPUTE = frozenset(op for op in ops_of(Family.ELEMENTWISE)
                          if all(o.exchange is not Exchange.ALWAYS for o in REGISTRY[op].operands))


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


def _role_accs(ctx: Ctx) -> dict[str, Node | None]:
    """wgmma accumulators (rmem tiles an async MMA accumulates into) -> the role they are allocated in."""
    out: dict[str, Node | None] = {}
    for n, _, _ in ctx.nodes:
        if n.op in _ASYNC_MMAS:
            at = ctx.defined_at.get(n.arg("acc"))
            out[n.arg("acc")] = ctx.role_of.get(id(at)) if at is not None else None
    return out


def _why_not_in_role(ctx: Ctx, n: Node, role: Node, accs: dict[str, Node | None]) -> str | None:
    """Why compute op ``n`` cannot run over the threads of ``role`` alone (None: it can).

    Its rmem operands must be tiles the role holds in the wgmma layout (``ir.fragments``): fragments of the
    destination's shape, row vectors broadcast along a fragment's columns or combined with each other; the
    elements then never leave their thread. ``reduce`` along a fragment's columns into a row vector of the role
    is the one op whose elements move, within each row's quad."""
    d = REGISTRY[n.op]
    tiles = [(o, a) for o, a in zip(d.operands, n.args) if o.kind == "buf"]
    if n.op is Op.ATOMIC_ADD and accs.get(n.arg("src"), False) is role:
        return None                                       # split-K: the role adds its accumulator's fragments
    lay = layouts(ctx)
    if n.op is Op.REDUCE:
        src, dst = lay.get(n.arg("src")), lay.get(n.arg("dst"))
        if src is not None and src.fragment and src.role is role and dst is not None and dst.kind == "rows" \
                and dst.role is role and n.attr("axis") in (1, -1):
            return None
        if src is not None and src.fragment and src.role is role:
            return (f"it reduces fragment `{n.arg('src')}` into `{n.arg('dst')}`, which is not an rmem ({src.rows}, 1) "
                    "row vector of the role (or along axis 0, across the quads)")
    if n.op not in _ROLE_COMPUTE:
        return ("its elements move between threads or its lowering synchronises the CTA, and only the role's "
                f"{ctx.threads_of(n)} threads run it")
    dst = ctx.buffers.get(tiles[0][1]) if tiles else None
    dst_lay = lay.get(tiles[0][1]) if tiles else None
    fragment = any((lay.get(a) is not None and lay[a].fragment) for _, a in tiles)
    for o, name in tiles:
        t = ctx.buffers.get(name)
        if t is None or t.space is not MemSpace.RMEM:
            continue
        held = lay.get(name)
        if held is None or held.role is not role:
            at = ctx.defined_at.get(name)
            if at is not None and ctx.role_of.get(id(at)) is role:
                return (f"`{name}` is an rmem tile of the role in no layout it holds: an accumulator, a "
                        "(64 * warpgroups, N) fragment with N a multiple of 8, or a (64 * warpgroups, 1) f32/i32 row "
                        "vector")
            return (f"`{name}` is an rmem tile spread over all the CTA's {ctx.program.threads} threads; the role's "
                    f"{ctx.threads_of(n)} threads hold only their own slots of it")
        if held.kind == "rows":
            if not fragment and (dst_lay is None or dst_lay.kind != "rows"):
                return (f"row vector `{name}` is held by the 4 threads of each row's quad: it is read along a "
                        "fragment's columns or combined into another row vector of the role, not written into "
                        f"`{tiles[0][1]}`")
            continue
        if dst is not None and [ctx.static(x) for x in t.shape] != [ctx.static(x) for x in dst.shape]:
            return (f"wgmma fragment `{name}` is broadcast to the shape of `{tiles[0][1]}`: its elements would "
                    "move between the role's threads")
    return None


def _thread_map(ctx: Ctx, n: Node) -> tuple:
    """Which thread of its role touches which element of the tiles of elementwise op ``n`` (``lower/thread_map.py``):
    the fragments of an accumulator among its operands, else its destination split over the role's threads."""
    tiles = [a for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf"]
    frag = any(getattr(ctx.buffers.get(a), "space", None) is MemSpace.RMEM for a in tiles)
    dst = ctx.buffers.get(tiles[0])
    return ("the accumulator's fragments" if frag else "the tile split over the role's threads",
            tuple(ctx.static(d) for d in dst.shape) if dst is not None else None)


def _crossed_tiles(ctx: Ctx, nodes: list[tuple[Node, str]]) -> Iterator[tuple[Node, str, str, Node]]:
    """(op, path, tile, the op that writes it) where two elementwise ops of one role touch an smem tile that one of
    them writes with different element-to-thread maps, or one reads it broadcast: the role's threads have no
    barrier between them, so a thread would touch an element another thread writes, in either order."""
    seen: dict[str, list[tuple[Node, tuple | None, bool]]] = {}
    for n, path in nodes:
        key = _thread_map(ctx, n)
        for o, name in zip(REGISTRY[n.op].operands, n.args):
            t = ctx.buffers.get(name) if o.kind == "buf" else None
            if t is None or t.space is not MemSpace.SMEM:
                continue
            k = key if tuple(ctx.static(d) for d in t.shape) == key[1] else None     # None: read broadcast
            seen.setdefault(name, []).append((n, k, o.effect_of(n).writes))
    for name, uses in seen.items():
        writer = next((m for m, _, w in uses if w), None)
        if writer is None:
            continue
        first = uses[0][1]
        clash = next(((m, k) for m, k, _ in uses if k != first or k is None), None)
        if clash is not None:
            m = clash[0] if clash[0] is not writer else uses[0][0]
            yield m, next(p for x, p in nodes if x is m), name, writer


@rule("role.compute", "role", "a compute op inside a role runs over the role's threads only: elementwise ops on "
      "smem tiles and on the fragments and row vectors the role holds, row reductions of a fragment, each smem "
      "tile the role writes touched one way",
      guards=COMPUTE_OPS)
def _compute_in_role(ctx: Ctx) -> Iterable[Diagnostic]:
    """The lowering maps the elements of an op inside a role to the role's threads (``lower/thread_map.py``):
    an smem tile split over them, or a wgmma accumulator's fragments in place. Anything else inside a role
    would be lowered over every thread of the CTA, skipping the elements of the other roles' threads (or
    waiting at a CTA barrier they never reach), while the interpreter computes the whole tile. An smem tile
    the role writes is touched by one map only: the role's threads have no barrier between them."""
    accs = _role_accs(ctx)
    hint = (f"inside a role use {', '.join(sorted(o.value for o in _ROLE_COMPUTE))} on smem tiles and the tiles the "
            "role holds (wgmma accumulators and other (64 * warpgroups, N) fragments of the destination's shape, "
            "(64 * warpgroups, 1) row vectors), and reduce a fragment's rows into a row vector; run the rest at the "
            "top level, after the roles and a sync()")
    per_role: dict[int, list[tuple[Node, str]]] = {}
    for n, path, _ in ctx.nodes:
        role = ctx.role_of.get(id(n))
        if role is None or n.op not in COMPUTE_OPS:
            continue
        why = _why_not_in_role(ctx, n, role, accs)
        if why:
            yield ctx.diag("role.compute", n, f"`{n.op.value}` inside role `{role.args[0]}`: {why}", path=path,
                           hint=hint)
        elif n.op in _ROLE_COMPUTE:
            per_role.setdefault(id(role), []).append((n, path))
    for nodes in per_role.values():
        for n, path, tile, writer in _crossed_tiles(ctx, nodes):
            yield ctx.diag("role.compute", n, f"`{n.op.value}` touches smem tile `{tile}`, which `{writer.op.value}` "
                                              f"at line {writer.line} writes inside the same role, through another "
                                              "mapping of its elements to the role's threads (or a broadcast read): "
                                              "with no barrier between those threads, one would touch an element "
                                              "another writes", path=path,
                           hint="touch a tile the role writes in one way only (every op on the accumulator, or "
                                "every op on smem tiles of its shape), or read it after the roles, behind a sync()")


_PLAIN_COPIES = frozenset(op for op, d in REGISTRY.items() if d.family is Family.COPY and d.engine == "plain")
_CTA_MMAS = frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is not Completion.MMA_GROUP)


@rule("role.copy", "role", "inside a role, copies are TMA or cp.async and products wgmma; a plain store writes a "
      "tile the role holds", guards=_PLAIN_COPIES | _CTA_MMAS)
def _copy_in_role(ctx: Ctx) -> Iterable[Diagnostic]:
    """A plain load, gather or store is lowered over every thread of the CTA (each its share of the window), and
    so is an fma / mma_sync product: inside a role only the role's threads would run it. A store of a tile the
    role holds (an accumulator, a fragment, a row vector, a fused epilogue's row state) is lowered per thread."""
    held = set(layouts(ctx)) | epilogue_state(ctx.program)
    for n, path, _ in ctx.nodes:
        role = ctx.role_of.get(id(n))
        if role is None or n.op not in _PLAIN_COPIES | _CTA_MMAS:
            continue
        if n.op is Op.STORE and n.arg("src") in held:
            continue
        what = (f"`{n.op.value}` of `{n.arg('src')}`, which the role does not hold in the wgmma layout,"
                if n.op is Op.STORE else f"`{n.op.value}`")
        yield ctx.diag("role.copy", n, f"{what} inside role `{role.args[0]}`: its lowering spreads it over every "
                                       f"thread of the CTA, and only the role's {ctx.threads_of(n)} threads run it",
                       path=path, hint="in a role copy with tma_load / cp_async_bar / tma_store (after fence_async() "
                                       "and role_sync()), multiply with wgmma; or move it to the top level")


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
            k = 1 if b[0] is BarrierUse.EXPECT_TX else ctx.warpgroups_of(n)
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
            sizes = [copy_bytes(ctx, m) for m in loads]
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
        "an op reads or writes a wgmma accumulator before a wgmma_wait covers the wgmma that writes it",
        "a ring slot or mbarrier index falls outside its slots at some trip of the simulated launches",
        "a multicast copy overwrites a peer CTA's ring slot before the peer's readers released it on a barrier of "
        "the copying CTA"), (
        _uses(BarrierUse.WAIT),
        _uses(BarrierUse.EXPECT_TX) | _uses(BarrierUse.COMPLETE_TX),
        _READERS,
        _smem_side(lambda e: e.writes),
        frozenset(op for op, d in REGISTRY.items() if any(o.cluster for o in d.operands)),
        frozenset(op for op in _READERS if REGISTRY[op].proxy is Proxy.ASYNC),
        frozenset(),
        frozenset(op for op, d in REGISTRY.items()
                  if any(o.kind == "buf" and MemSpace.RMEM in o.space and any(e.reads or e.writes for e in o.effects)
                         for o in d.operands)
                  and d.completion is not Completion.MMA_GROUP),
        frozenset(_SLOT_OPS),
        _MULTICAST)):
    _protocol_rule(_id, _summary, _guards)
