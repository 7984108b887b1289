"""``prefetch``: a CTA-collective loop's copies into shared memory issued one trip ahead (cp.async, two buffers).

A role-free kernel waits for each trip's tiles before it computes on them: the copy latency is paid once per trip.
``prefetch`` gives every tile the loop loads a second buffer and copies trip t + 1's tiles with ``cp_async`` while
trip t computes, the trips unrolled by two so that each half names its own buffers (CTA-collective compute reads
whole tiles by name, not ring slots).

Before (the MoE seed's reduction over the hidden dimension)::

    for kt in range(cdiv(H, BK)):
        load(x_s, x[tile(bid.x, 1), tile(kt, BK)])
        load(wg_s, w_gate[e, tile(kt, BK), tile(it, BI)])
        sync()
        mma(acc_g, x_s, wg_s)
        sync()

After::

    x_s1 = smem(bf16, (1, BK))
    wg_s1 = smem(bf16, (BK, BI))
    ...
    cp_async(x_s, x[tile(bid.x, 1), tile(0, BK)])
    cp_async(wg_s, w_gate[e, tile(0, BK), tile(it, BI)])
    for kt2 in range(cdiv(cdiv(H, BK), 2)):
        kt = kt2 * 2
        cp_async(x_s1, x[tile(bid.x, 1), tile(kt + 1, BK)])
        cp_async(wg_s1, w_gate[e, tile(kt + 1, BK), tile(it, BI)])
        cp_async_wait(2)
        sync()
        mma(acc_g, x_s, wg_s)
        sync()
        if kt + 1 < cdiv(H, BK):
            kt1 = kt + 1
            cp_async(x_s, x[tile(bid.x, 1), tile(kt1 + 1, BK)])
            cp_async(wg_s, w_gate[e, tile(kt1 + 1, BK), tile(it, BI)])
            cp_async_wait(2)
            sync()
            mma(acc_g, x_s1, wg_s1)
            sync()
    cp_async_wait(0)

Each ``cp_async`` commits its own group, so a trip that issues L copies waits until L groups are in flight: its
own tiles have landed, the next trip's are on the way. The copies always go one trip ahead, also past the last
trip (those windows lie past the tensor's edge and read zeros that nothing uses), so every trip waits for the
same count and no wait depends on a branch; the drain after the loop retires the last of them.

Precondition: a role-free kernel; a loop ``for v in range(T)`` that loads into smem tiles before its first
``sync()`` (one stage, the gmem window's dtype, each window naming ``v`` only inside ``tile(..)``, so that the copy
one trip past the end reads zeros, and nothing the body binds) and ends with ``sync()`` (the trip's reads are over
before the next trip's copies land in that buffer); the tiles are named nowhere outside the loop and by nothing
before the first ``sync()`` but their loads (after it, the trip may update them in place: each trip starts from
its own copy); the body binds no name (its second, unrolled trip would bind it again). What else runs
before the first ``sync()`` (an ``iota``, a ``fill``) runs before the copies, as it ran before the barrier.
Applies to the MoE, KDA prefill and attention seeds' loops and to any role-free kernel that loads, syncs and computes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import map_nodes, namer, refuse_unless, stmt, subst_node, subst_view, view_syms, walk_nodes
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols
from cake_core.ir.opdef import At, Slot, Tile, View, buffer_name
from cake_core.ir.ops import Node, Op, loop_range
from cake_core.ir.printer import fmt_view
from cake_core.ir.program import Program


def prefetch(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    refuse_unless(not any(n.op in (Op.ROLE, Op.CLUSTER) for n in walk_nodes(p.body)),
                  "warp roles or a cluster: their producers already copy ahead")
    reasons, eligible = [], []
    for n in walk_nodes(p.body):
        if n.op is Op.FOR:
            why = _not_prefetchable(p, n)
            (reasons.append(f"loop `{n.arg('var')}` (line {n.line}): {why}") if why else eligible.append(n))
    refuse_unless(bool(reasons or eligible), "no loop")
    refuse_unless(bool(eligible), "; ".join(reasons))
    loop = eligible[int(rng.integers(len(eligible)))]
    head, rest = _split(loop.body)
    loads = [n for n in head if n.op is Op.LOAD]
    pre = tuple(n for n in head if n.op is not Op.LOAD)
    name = namer(p)
    seconds = {n.arg("dst"): name(f"{n.arg('dst')}1") for n in loads}
    v = loop.arg("var")
    v2, v1 = name(f"{v}2"), name(f"{v}1")
    trips = loop_range(loop)[1]

    def copies(into: dict[str, str], at: Expr) -> list[Node]:
        return [stmt(f"cp_async({into[n.arg('dst')]}, {fmt_view(subst_view(n.arg('src'), {v: at}))})")
                for n in loads]

    def landed() -> list[Node]:
        return [stmt(f"cp_async_wait({len(loads)})"), stmt("sync()")]

    same = {d: d for d in seconds}
    first = [stmt(f"{v} = {v2} * 2"), *pre, *copies(seconds, Bin("+", Sym(v), 1)), *landed(), *rest]
    again = lambda ns: tuple(_rename(subst_node(n, {v: Sym(v1)}), seconds) for n in ns)     # noqa: E731
    second = replace(stmt(f"if {v} + 1 < {fmt_expr(trips)}:\n    sync()"),
                     body=(stmt(f"{v1} = {v} + 1"), *again(pre), *copies(same, Bin("+", Sym(v1), 1)), *landed(),
                           *again(rest)))
    new_loop = replace(stmt(f"for {v2} in range({fmt_expr(Call('cdiv', (trips, 2)))}):\n    sync()"),
                       body=(*first, second))

    body = map_nodes(p.body, lambda n: (*copies(same, 0), new_loop, stmt("cp_async_wait(0)")) if n == loop else n)
    body = map_nodes(body, lambda n: (n, replace(n, result=seconds[n.result]))
                     if n.op is Op.SMEM and n.result in seconds else n)
    return replace(p, body=body)


def _split(body: tuple[Node, ...]) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """A loop body's head (what runs before its first top-level sync()) and the rest (after that sync)."""
    i = next((i for i, n in enumerate(body) if n.op is Op.SYNC), len(body))
    return body[:i], body[i + 1:]


def _not_prefetchable(p: Program, loop: Node) -> str:
    """Why ``loop``'s copies cannot be issued a trip ahead ('' when they can)."""
    start, _, step = loop_range(loop)
    if fmt_expr(start) != "0" or fmt_expr(step) != "1" or loop.attr("unroll") != 1:
        return "not a plain range(extent) without unrolling"
    body = loop.body
    head, rest = _split(body)
    loads = [n for n in head if n.op is Op.LOAD]
    if not loads:
        return "it loads nothing before its first sync()"
    if not rest or rest[-1].op is not Op.SYNC:
        return "its loads are not followed by sync(), or its body does not end with sync()"
    var = loop.arg("var")
    bound = {n.result for n in walk_nodes(body) if n.result} | {
        n.arg("var") for n in walk_nodes(body) if n.op in (Op.FOR, Op.LET, Op.SCALAR)}
    decls = {n.result: n for n in walk_nodes(p.body) if n.op is Op.SMEM}
    dtypes = {q.name: q.type.dtype for q in p.params}
    dsts = [n.arg("dst") for n in loads]
    if len(set(dsts)) != len(dsts):
        return "two loads fill one tile"
    for n in loads:
        d, src = n.arg("dst"), n.arg("src")
        if d not in decls:
            return f"`{d}` is not a shared-memory tile"
        if decls[d].attr("stages") != 1:
            return f"`{d}` is already a ring"
        if dtypes.get(src.buf) != decls[d].arg("dtype"):
            return f"`{d}` and `{src.buf}` differ in dtype"
        syms = view_syms(src)
        if any(var in symbols(ix.size) if isinstance(ix, Tile) else isinstance(ix, At) and var in symbols(ix.index)
               for ix in src.index):
            return f"the window {fmt_view(src)} names `{var}` outside tile(..): a copy one trip past the end " \
                   "could leave the tensor"
        if var not in syms:
            return f"the window {fmt_view(src)} does not move with `{var}`"
        if syms & bound:
            return f"the window {fmt_view(src)} names {sorted(syms & bound)}, bound inside the loop"
    inside = {id(n) for n in walk_nodes((loop,))}
    for n in walk_nodes(p.body):
        if id(n) in inside or n.op is Op.SMEM:
            continue
        named = {buffer_name(a) for a in n.args} & set(dsts)
        if named:
            return f"line {n.line} ({n.op.value}) names {sorted(named)} outside the loop"
    for n in walk_nodes(tuple(m for m in head if m.op is not Op.LOAD)):
        if {buffer_name(a) for a in n.args} & set(dsts):
            return f"line {n.line} ({n.op.value}) names a loaded tile before the sync()"
    for n in walk_nodes(tuple(m for m in body if m.op is not Op.LOAD)):
        if n.op in (Op.LET, Op.SCALAR) or n.result:
            return f"line {n.line} ({n.op.value}) binds a name the unrolled second trip would bind again"
    return ""


def _rename(n: Node, names: dict[str, str]) -> Node:
    """``n`` (and its body) with the tiles named in ``names`` renamed in every operand."""
    def one(a):
        if isinstance(a, str) and a in names:
            return names[a]
        if isinstance(a, View) and a.buf in names:
            return replace(a, buf=names[a.buf])
        if isinstance(a, Slot) and a.buf in names:
            return replace(a, buf=names[a.buf])
        return a
    return replace(n, args=tuple(one(a) for a in n.args), body=tuple(_rename(b, names) for b in n.body))
