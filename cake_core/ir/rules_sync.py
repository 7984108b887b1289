"""Verifier rules on where synchronisation objects live and what must come before an async op (families:
mbarrier, cluster, tma).

- ``mbarrier.placement``: mbarriers are allocated at the kernel's top level (every thread initialises them
  before the roles start), never in a role, a loop or an ``if``.
- ``mbarrier.count``: an mbarrier array holds a positive compile-time number of barriers, each expecting
  1 to ``Arch.mbarrier_max_arrivals`` arrivals per phase (``mbarrier.init``'s range).
- ``cluster.placement``: one ``cluster((cx, cy, cz))`` declaration, the kernel's first statement.
- ``cluster.grid``: each grid extent is a multiple of the cluster's extent along it (a launch of a partial
  cluster fails). An extent that is a multiple for every shape is accepted; otherwise the rule looks for a
  shape (the run's, else small and tile-sized values of the dims, and the SM counts of the target's GPUs
  for ``num_sms``) where it is not, and names it.
- ``tma.store_fence``: a ``tma_store`` reads its smem tile through the async proxy; generic-proxy writes to
  that tile (threads' stores, compute ops, cp.async) must be followed by ``fence_async()`` in the writing
  threads before it, and by a barrier over them (``sync()``; ``role_sync()`` in their role) so that the
  issuing thread sees every writer's elements.
- ``wgmma.smem_fence``: the same for a wgmma operand that its own role's threads wrote (an accumulator cast
  into a tile for the next wgmma): ``fence_async()``, then ``role_sync()``, then the wgmma.
- ``control.role_sync``: ``role_sync()`` stands inside a role.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Iterable, Iterator

from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols, try_evaluate
from cake_core.ir.opdef import Alloc, Completion, Proxy, SyncKind, buffer_name
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.rule_ctx import Ctx, RuleSet
from cake_core.ir.types import MemSpace
from cake_core.outcome import Diagnostic
from cake_core.targets import get_gpu, known_gpus

RULESET = RuleSet()
rule = RULESET.rule

_MBARRIERS = frozenset(op for op, d in REGISTRY.items() if d.allocates is Alloc.MBARRIER)
_FENCES = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.PROXY_FENCE)
_CTA_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CTA)
_ROLE_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.ROLE)
_ASYNC_MMAS = frozenset(op for op, d in REGISTRY.items() if d.completion is Completion.MMA_GROUP)
# ops that read an smem slot through the async proxy and need generic writes fenced before them
_ASYNC_SMEM_READERS = frozenset({Op.TMA_STORE})


def _path(ctx: Ctx, n: Node) -> str:
    return next((p for m, p, _ in ctx.nodes if m is n), "kernel")


# ----------------------------------------------------------------- mbarriers

@rule("mbarrier.placement", "mbarrier", "mbarriers are allocated at the kernel's top level, before the roles",
      guards=_MBARRIERS)
def _placement(ctx: Ctx) -> Iterable[Diagnostic]:
    top = {id(n) for n in ctx.program.body}
    for n, path, _ in ctx.nodes:
        if n.op in _MBARRIERS and id(n) not in top:
            where = (f"role `{ctx.role_of[id(n)].args[0]}`" if id(n) in ctx.role_of else "a loop or an `if`")
            yield ctx.diag("mbarrier.placement", n, f"mbarrier `{n.result}` is allocated inside {where}: every "
                                                    "thread of the CTA initialises mbarriers before the roles run",
                           path=path, hint=f"move `{n.result} = mbarrier(...)` to the top level, above the roles")


@rule("mbarrier.count", "mbarrier", "an mbarrier array has a positive static number of barriers, each expecting "
                                    "1 to the target's maximum arrivals", guards=_MBARRIERS)
def _count(ctx: Ctx) -> Iterable[Diagnostic]:
    most = ctx.target.mbarrier_max_arrivals
    for n, path, _ in ctx.nodes:
        if n.op not in _MBARRIERS:
            continue
        count, arrivals = ctx.static(n.args[0]), n.attr("arrivals")
        if count is None or count < 1:
            yield ctx.diag("mbarrier.count", n, f"mbarrier `{n.result}` has {fmt_expr(n.args[0])} barriers: a "
                                                "positive compile-time number is needed", path=path,
                           hint="size it with a const, e.g. mbarrier(S) for a ring of S slots")
        if not isinstance(arrivals, int) or not 1 <= arrivals <= most:
            yield ctx.diag("mbarrier.count", n, f"mbarrier `{n.result}` expects {arrivals} arrivals per phase; "
                                                f"mbarrier.init takes 1 to {most}", path=path,
                           hint="arrivals counts the arrive()s of one phase: one per warpgroup of each arriving "
                                "role, one per expect_tx")


# ------------------------------------------------------------------- cluster

@rule("cluster.placement", "cluster", "one cluster declaration, the kernel's first statement", guards=(Op.CLUSTER,))
def _cluster_placement(ctx: Ctx) -> Iterable[Diagnostic]:
    decls = [(n, p) for n, p, _ in ctx.nodes if n.op is Op.CLUSTER]
    for i, (n, path) in enumerate(decls):
        if i:
            yield ctx.diag("cluster.placement", n, f"a second cluster declaration (the first is at line "
                                                   f"{decls[0][0].line})", path=path,
                           hint="declare the cluster shape once")
        elif not ctx.program.body or ctx.program.body[0] is not n:
            yield ctx.diag("cluster.placement", n, "the cluster declaration is not the kernel's first statement: "
                                                   "the launch, the interpreter and the checker read it there",
                           path=path, hint="move cluster((cx, cy, cz)) to the top of the kernel body")


def known_divisor(e: Expr, consts: dict[str, int]) -> int:
    """A number that divides ``e`` for every value of its symbols (1 when nothing better is known; 0 for 0)."""
    if isinstance(e, bool) or not isinstance(e, (int, Sym, Bin, Call)):
        return 1
    if isinstance(e, int):
        return abs(e)
    if isinstance(e, Sym):
        v = consts.get(e.name)
        return abs(v) if isinstance(v, int) else 1
    if isinstance(e, Bin):
        a, b = known_divisor(e.a, consts), known_divisor(e.b, consts)
        if e.op == "*":
            return a * b
        if e.op in ("+", "-"):
            return math.gcd(a, b)
        return 1
    if e.fn in ("min", "max"):
        return math.gcd(*(known_divisor(a, consts) for a in e.args))
    return 1


def _samples(ctx: Ctx) -> Iterator[dict[str, int]]:
    """Shapes to try a grid on: the run's, then every dim at one of a few small and tile-sized values, then one
    dim varied at a time, each with the SM counts of the target's GPUs."""
    sms = sorted({g.sms for g in map(get_gpu, known_gpus()) if g.arch == ctx.target.arch} | {1, 2, 3})
    yield from ({**s, "num_sms": m} for s in ctx.shapes for m in sms)
    tiles = sorted({v for v in ctx.consts.values() if isinstance(v, int) and v > 0})
    values = sorted({1, 2, 3, 5, 7} | {t * k + d for t in tiles for k in (1, 2, 3) for d in (-1, 0, 1) if t * k + d > 0})
    dims = sorted(ctx.dims)
    for v in values:
        yield from ({**{d: v for d in dims}, "num_sms": m} for m in sms)
    for d, v, w in itertools.product(dims, values, (1, 64, 1000)):
        yield from ({**{x: w for x in dims}, d: v, "num_sms": m} for m in sms)


@rule("cluster.grid", "cluster", "each grid extent is a multiple of the cluster's extent along it",
      guards=(Op.CLUSTER,))
def _cluster_grid(ctx: Ctx) -> Iterable[Diagnostic]:
    n = next((m for m in ctx.program.body if m.op is Op.CLUSTER), None)
    if n is None:
        return
    dims = [ctx.static(d) for d in n.args[0]]
    if None in dims or any(d < 1 for d in dims):
        return          # resources.cluster reports the shape itself
    grid = list(ctx.program.grid)
    for axis, (c, g) in enumerate(zip(dims + [1] * 3, grid)):
        if c == 1 or known_divisor(g, ctx.consts) % c == 0 and known_divisor(g, ctx.consts):
            continue
        env0 = dict(ctx.consts)
        witness = None
        for s in itertools.islice(_samples(ctx), 4000):
            v = try_evaluate(g, {**env0, **s})
            if isinstance(v, int) and v >= 1 and v % c:
                witness = (s, v)
                break
        if witness is None:
            continue    # not provably a multiple, but no shape found where it is not
        s, v = witness
        used = {k: x for k, x in s.items() if k in symbols(g)}
        yield ctx.diag("cluster.grid", n, f"grid extent {'xyz'[axis]} = {fmt_expr(g)} is not always a multiple of "
                                          f"the cluster's {c}: {', '.join(f'{k}={x}' for k, x in used.items())} "
                                          f"gives {v}", path=_path(ctx, n),
                       witness=[f"{', '.join(f'{k}={x}' for k, x in used.items())}: grid {'xyz'[axis]} = {v}, "
                                f"{v} % {c} = {v % c}"],
                       hint=f"round the extent up to whole clusters: cdiv(..., {c}) * {c} (CTAs past the problem's "
                            "edge are guarded by the loads and stores)")


# ------------------------------------------------------------------ TMA store

def _generic_smem_writes(ctx: Ctx, n: Node) -> list[str]:
    """The smem tiles ``n`` writes through the generic proxy."""
    d = REGISTRY[n.op]
    if d.proxy is not Proxy.GENERIC:
        return []
    out = []
    for o, a in zip(d.operands, n.args):
        name = buffer_name(a) if o.memory else None
        t = ctx.buffers.get(name) if name else None
        if t is not None and t.space is MemSpace.SMEM and o.effect_of(n).modifies:
            out.append(name)
    return out


def _fence_order(ctx: Ctx, rule_id: str, readers: frozenset[Op], same_role: bool) -> list[Diagnostic]:
    """Generic-proxy smem writes before an async-proxy read of the tile by one of ``readers``: fence_async() by the
    writing threads, then a barrier over them (sync() at the top level, role_sync() in their role), so that the
    thread or warpgroup that issues the read sees every writer's elements. ``same_role``: only writes of the
    reader's own role count (another role's are ordered by the mbarriers between them: the protocol checker).

    Statement order is followed with every loop body run twice (a write late in one trip reaches the next
    trip's read); an ``if`` body may run. A fence orders the writes of the threads that run it: those of its
    role, or every thread's at the top level."""
    pending: dict[str, list[list[Any]]] = {}       # tile -> [writer role, write, fenced, synced]
    out: list[Diagnostic] = []
    reported: set[tuple[int, int]] = set()

    def report(n: Node, src: str, w: list[Any], why: str, hint: str) -> None:
        if (w[1].line, n.line) in reported:
            return
        reported.add((w[1].line, n.line))
        who = f"role {w[0].args[0]}" if w[0] is not None else "the CTA's threads"
        out.append(ctx.diag(rule_id, n, f"{n.op.value} reads `{src}` through the async proxy, but the "
                                        f"{w[1].op.value} at line {w[1].line} wrote it through the generic proxy "
                                        f"{why}", path=_path(ctx, n),
                            witness=[f"write: {w[1].op.value} at line {w[1].line} ({who})",
                                     f"read: {n.op.value} at line {n.line}"], hint=hint))

    def settle(role: Node | None) -> None:
        """A barrier of ``role`` (None: the CTA's): the fenced writes of its threads are now everyone's."""
        for k, ws in pending.items():
            for w in ws:
                if role is None or w[0] is role:
                    w[3] = w[2]
            pending[k] = [w for w in ws if not w[3]]

    def run(nodes: tuple[Node, ...]) -> None:
        for n in nodes:
            role = ctx.role_of.get(id(n))
            if n.op is Op.FOR:
                run(n.body)
                run(n.body)
                continue
            if n.body:
                run(n.body)
                continue
            if n.op in _FENCES:
                for ws in pending.values():
                    for w in ws:
                        w[2] = w[2] or role is None or w[0] is role
            elif n.op in _CTA_SYNCS:
                settle(None)
            elif n.op in _ROLE_SYNCS and role is not None:
                settle(role)
            elif n.op in readers:
                barrier = "sync()" if role is None else "role_sync()"
                for src in _async_smem_reads(ctx, n):
                    for w in pending.get(src, []):
                        if same_role and w[0] is not role:
                            continue
                        if not w[2]:
                            report(n, src, w, "and no fence_async() by its threads comes between",
                                   f"fence_async() after the writes, then {barrier}, before the {n.op.value}")
                        elif not w[3] and (role is None or w[0] is role):
                            report(n, src, w, f"and no {barrier} follows its fence: the thread that issues the "
                                              f"{n.op.value} may not see the other threads' writes",
                                   f"{barrier} after the fence_async(), before the {n.op.value}")
            for name in _generic_smem_writes(ctx, n):
                pending.setdefault(name, []).append([role, n, False, False])

    run(ctx.program.body)
    return out


def _async_smem_reads(ctx: Ctx, n: Node) -> list[str]:
    """The smem tiles ``n`` reads through the async proxy (its slot operands it only reads)."""
    out = []
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        name = buffer_name(a) if o.memory and o.kind == "slot" else None
        t = ctx.buffers.get(name) if name else None
        if t is not None and t.space is MemSpace.SMEM and not o.effect_of(n).modifies:
            out.append(name)
    return out


@rule("tma.store_fence", "tma", "a tma_store of smem that threads wrote needs fence_async() and then sync() (or, "
                                "in their role, role_sync()) between those writes and the store",
      guards=_ASYNC_SMEM_READERS | _FENCES)
def _store_fence(ctx: Ctx) -> Iterable[Diagnostic]:
    """One thread issues the store: every writer's fence, then a barrier that makes their writes its own."""
    return _fence_order(ctx, "tma.store_fence", _ASYNC_SMEM_READERS, same_role=False)


@rule("wgmma.smem_fence", "wgmma", "a wgmma operand its own role's threads wrote in smem (an accumulator cast into a "
                                   "tile) needs fence_async() and then role_sync() between those writes and the wgmma",
      guards=_ASYNC_MMAS)
def _wgmma_fence(ctx: Ctx) -> Iterable[Diagnostic]:
    """Each warpgroup reads the whole operand through the async proxy, its other threads' elements included."""
    return _fence_order(ctx, "wgmma.smem_fence", _ASYNC_MMAS, same_role=True)


@rule("control.role_sync", "control", "role_sync() is a barrier of one role's threads: it stands inside a role",
      guards=_ROLE_SYNCS)
def _role_sync_placement(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op in _ROLE_SYNCS and ctx.role_of.get(id(n)) is None:
            yield ctx.diag("control.role_sync", n, "role_sync() outside a role: it is the barrier of the enclosing "
                                                   "role's threads", path=path,
                           hint="use sync() at the top level, role_sync() inside a role")
