"""Chained GEMMs (attention-like): recognising the mainloop, and its warp specialisation.

The naive seed of softmax attention (and of any kernel of its shape: two products chained through an
elementwise epilogue) streams tiles of two operands past a resident tile of rows; on every trip it multiplies
the resident tile by the first streamed one into a fresh accumulator, runs an epilogue on that accumulator
with row vectors and per-trip masks, casts it to 16 bits and multiplies it by the second streamed tile into a
running accumulator; after the loop, a last epilogue and a store::

    [allocations]
    load(q_s, q[bid.y, tile(bid.x, BM), tile(0, D)])        # the resident operand (a1)
    fill(acc); fill(m_i, value=-inf); ...; sync()            # the running accumulator, row vectors, constants
    for j in range(cdiv(T, BN)):
        load(k_s, k[bid.y, tile(j, BN), tile(0, D)])         # b1, read transposed (K-major)
        load(v_s, v[bid.y, tile(j, BN), tile(0, D)])         # b2
        iota(col, base=j * BN - T, axis=1); ...; sync()      # per-trip masks
        transpose(kt_s, k_s); sync()
        fill(s); mma(s, q_s, kt_s)                           # the first product, fresh each trip
        select(s, keep, s, ninf); reduce(m_new, s, axis=1, fn="max"); ...     # the epilogue
        cast(p_s, s)                                         # a2: the first product in 16 bits
        mma(acc, p_s, v_s); sync()                           # the second product, running
    ewise(acc, acc, l_i, fn="div")                           # the tail
    store(o[bid.y, tile(bid.x, BM), tile(0, D)], acc)

``find_chained`` returns that structure as data or raises ``Refused`` naming the statement that does not fit.
``warp_specialize_chained`` rewrites it into a TMA producer role and a wgmma consumer role (the form of the
hand-written warp-specialised attention reference): the resident operand copied once as 64-column halves,
b1's halves and b2 in an S-stage ring, each on a barrier of its own (the first product and its epilogue run
while b2 lands); in the consumers the first product is ``wgmma(..., b_major="k", accumulate=False)`` over
the halves, the epilogue runs as written on tiles the role holds (``ir.fragments``: the accumulators and every
(rows, N) tile are fragments, (rows, 1) tiles row vectors, per-trip (1, N) masks fragments of the trip's
shape), and the second product takes the 16-bit tile as its register A. Tiles written only before the loop
(constants such as a -inf) stay in shared memory, filled before the roles.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cake_core.agents.mainloop import tile_types
from cake_core.agents.rewrite import (Refused, const_of, expr_text, namer, refuse_unless, stmt, stmts, view_syms,
                                      walk_nodes)
from cake_core.ir.expr import Bin, Sym
from cake_core.ir.ops import REGISTRY, Node, Op, Tile, View, loop_range
from cake_core.ir.printer import fmt_attr, fmt_view
from cake_core.ir.program import Program
from cake_core.ir.types import DType

SPAN = 64                     # 16-bit elements of one 128-byte swizzle span: a K-major wgmma slot's columns
KEYS = 64                     # the streamed tile's rows (the first product's N, the second's K)
PRODUCER_REGS, CONSUMER_REGS = 40, 232
_EPILOGUE = frozenset({Op.FILL, Op.CAST, Op.UNARY, Op.EWISE, Op.SELECT, Op.IOTA, Op.REDUCE})


@dataclass(frozen=True)
class Chained:
    """The two products of a chained-GEMM mainloop (see the module docstring)."""

    loop: Node                       # the loop over the streamed tiles
    first: Node                      # mma(acc1, a1, b1t): acc1 filled on every trip before it
    second: Node                     # mma(acc2, a2, b2): acc2 running across trips
    a1: tuple[str, View]             # the resident operand, loaded before the loop
    b1: tuple[str, View, str]        # the first product's b as loaded (tile, view, the transposed tile mma reads)
    b2: tuple[str, View]
    a2: str                          # the 16-bit tile the first product is cast into, the second product's a
    head: tuple[Node, ...]           # allocations
    prologue: tuple[Node, ...]       # fills (and syncs) between the allocations and the loop
    tail: tuple[Node, ...]           # after the loop: its epilogue and stores
    rows: str                        # the constants of the accumulators' rows, the streamed tile's rows,
    keys: str                        # the first product's reduction and the second product's columns
    red: str
    cols: str


def _writes(n: Node) -> set[str]:
    return {a for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf" and o.effect_of(n).modifies}


def find_chained(p: Program) -> Chained:
    """The chained-GEMM mainloop of a CTA-collective program (no roles), or ``Refused``."""
    refuse_unless(not any(n.op is Op.ROLE for n in p.body), "the program already has warp roles")
    loops = [i for i, n in enumerate(p.body) if n.op is Op.FOR]
    refuse_unless(len(loops) == 1, f"the kernel's top level has {len(loops)} loops; a chained mainloop is one loop")
    i = loops[0]
    loop, before, tail = p.body[i], p.body[:i], p.body[i + 1:]
    refuse_unless(not any(n.op is Op.FOR for n in walk_nodes(loop.body)), "the streamed loop holds another loop")
    mmas = [n for n in loop.body if n.op is Op.MMA]
    refuse_unless(len(mmas) == 2 and not any(n.op is Op.MMA for n in walk_nodes(before + tail)),
                  f"the streamed loop holds {len(mmas)} mma (a chained mainloop has two, and none outside it)")
    first, second = mmas
    types = tile_types(p)
    var = loop.arg("var")
    head = tuple(n for n in before if n.op in (Op.SMEM, Op.RMEM, Op.LET))
    prologue = tuple(n for n in before if n.op not in (Op.SMEM, Op.RMEM, Op.LET))
    resident = {n.arg("dst"): n.arg("src") for n in prologue if n.op is Op.LOAD}
    for n in prologue:
        refuse_unless(n.op in (Op.LOAD, Op.FILL, Op.SYNC),
                      f"`{n.op.value}` (line {n.line}) before the loop: the prologue of a chained mainloop loads the "
                      "resident operand and fills tiles")
    loads = {n.arg("dst"): n.arg("src") for n in loop.body if n.op is Op.LOAD}
    transposed = {n.arg("dst"): n.arg("src") for n in loop.body if n.op is Op.TRANSPOSE and n.arg("src") in loads}
    acc1, a1, b1t = (first.arg(x) for x in ("acc", "a", "b"))
    acc2, a2, b2 = (second.arg(x) for x in ("acc", "a", "b"))
    refuse_unless(a1 in resident and var not in view_syms(resident[a1]),
                  f"the first mma's a `{a1}` is not loaded once before the loop")
    refuse_unless(b1t in transposed, f"the first mma's b `{b1t}` is not the transpose of a tile the loop loads: the "
                                     "K-major wgmma reads the loaded rows")
    b1 = transposed[b1t]
    refuse_unless(b2 in loads and var in view_syms(loads[b2]), f"the second mma's b `{b2}` is not loaded by the loop")
    refuse_unless(var in view_syms(loads[b1]), f"`{b1}`'s window does not move with the loop variable `{var}`")
    refuse_unless(set(loads) == {b1, b2}, f"the loop loads {', '.join(sorted(set(loads) - {b1, b2}))} besides the "
                                          "mma operands")
    casts = [n for n in loop.body if n.op is Op.CAST and n.arg("dst") == a2]
    refuse_unless(len(casts) == 1, f"the second mma's a `{a2}` is not written by one cast in the loop")
    j_first, j_second = loop.body.index(first), loop.body.index(second)
    refuse_unless(loop.body.index(casts[0]) < j_second and j_first < loop.body.index(casts[0]),
                  "the cast into the second mma's a does not come between the two products")
    fills = [n for n in loop.body[:j_first] if n.op is Op.FILL and n.arg("dst") == acc1]
    refuse_unless(bool(fills) and float(fills[-1].attr("value")) == 0.0,
                  f"the first product's accumulator `{acc1}` is not zero-filled on every trip before the mma")
    refuse_unless(not any(n.op is Op.FILL and n.arg("dst") == acc2 for n in loop.body),
                  f"the second product's accumulator `{acc2}` is reset in the loop: it is no running sum")
    for n in loop.body:
        if n.op in (Op.LOAD, Op.SYNC, Op.MMA) or (n.op is Op.TRANSPOSE and n.arg("dst") == b1t):
            continue
        refuse_unless(n.op in _EPILOGUE, f"the loop holds `{n.op.value}` (line {n.line}), which the consumer's "
                                         "epilogue does not run (elementwise ops and row reductions)")
        refuse_unless(not ({b1, b2, b1t, a1} & set(a for o, a in zip(REGISTRY[n.op].operands, n.args)
                                                   if o.kind == "buf")),
                      f"`{n.op.value}` (line {n.line}) touches an operand tile the producer copies")
        if n.op is Op.REDUCE:
            refuse_unless(n.attr("axis") in (1, -1), f"`reduce` (line {n.line}) runs across rows (axis 0)")
    for n in tail:
        refuse_unless(n.op in _EPILOGUE or n.op in (Op.STORE, Op.SYNC),
                      f"`{n.op.value}` after the loop (line {n.line}): its tail holds elementwise ops and stores")
    ta1, tb1, tb2, ta2 = types[a1], types[b1], types[b2], types[a2]
    refuse_unless(all(t.dtype in (DType.BF16, DType.F16) for t in (ta1, tb1, tb2, ta2)) and
                  len({t.dtype for t in (ta1, tb1, tb2, ta2)}) == 1, "the mma operands are not all bf16 or all f16")
    refuse_unless(all(len(t.shape) == 2 for t in (ta1, tb1, tb2, types[acc1], types[acc2])),
                  "the mma operands are not 2-D tiles")
    rows, red = const_of(p, ta1.shape[0]), const_of(p, ta1.shape[1])
    keys, cols = const_of(p, tb1.shape[0]), const_of(p, tb2.shape[1])
    refuse_unless(None not in (rows, red, keys, cols) and const_of(p, tb1.shape[1]) == red and
                  const_of(p, tb2.shape[0]) == keys, "the tiles' shapes are not program constants that chain: "
                                                     "a1 (rows, red), b1 (keys, red), b2 (keys, cols)")
    refuse_unless(len({rows, keys, red}) == 3 and cols not in (rows, keys), "the tiles' dimensions share a constant")
    env = p.const_env
    refuse_unless(env[red] % SPAN == 0 and env[red] <= 4 * SPAN,
                  f"the first product's reduction {red} = {env[red]} is not 64, 128, 192 or 256 (whole spans)")
    refuse_unless(env[cols] % SPAN == 0 and env[cols] <= 256,
                  f"the second product's columns {cols} = {env[cols]} are not 64, 128, 192 or 256 (wgmma's N)")
    for view, what in ((resident[a1], "resident operand"), (loads[b1], "first streamed operand")):
        last = view.index[-1]
        refuse_unless(isinstance(last, Tile) and last.size == Sym(red) and not last.offset,
                      f"the {what}'s window does not take its last dimension as tile(i, {red})")
    return Chained(loop, first, second, (a1, resident[a1]), (b1, loads[b1], b1t), (b2, loads[b2]), a2, head,
                   prologue, tail, rows, keys, red, cols)


def _half(view: View, h: int, halves: int) -> View:
    """The window's h-th 64-column part (its last index ``tile(i, RED)`` becomes ``tile(i * halves + h, 64)``)."""
    last = view.index[-1]
    start = Bin("+", Bin("*", last.index, halves), h) if last.index != 0 else h
    return replace(view, index=view.index[:-1] + (Tile(start, SPAN),))


def _slot(j: str, S: str, halves: int, h: int) -> str:
    """The ring slot of half ``h`` of trip ``j``'s first streamed tile (``halves`` slots a stage)."""
    base = f"{j} % {S} * {halves}" if halves > 1 else f"{j} % {S}"
    return f"{base} + {h}" if h else base


def warp_specialize_chained(p: Program, m: Chained, rng: np.random.Generator) -> Program:
    """The producer/consumer form of a chained mainloop (see the module docstring)."""
    env = p.const_env
    types = tile_types(p)
    wg = 2 if env[m.rows] >= 128 else int(rng.choice((1, 2)))
    stages = int(rng.choice((2, 3)))
    halves = env[m.red] // SPAN
    start, stop, step = loop_range(m.loop)
    refuse_unless(start == 0 and step == 1, "the streamed loop does not count from 0 in steps of 1")
    name = namer(p)
    S, qf, full, full2, empty = name("S"), name("q_full"), name("full"), name("full2"), name("empty")
    j = m.loop.arg("var")
    extent = expr_text(stop)
    a1, b1, b1t, b2 = m.a1[0], m.b1[0], m.b1[2], m.b2[0]
    acc1, acc2 = m.first.arg("acc"), m.second.arg("acc")
    dt = types[a1].dtype.value
    rows, keys, cols = m.rows, m.keys, m.cols
    nbytes = types[a1].dtype.bytes

    # which tiles the loop writes (they move into the consumers), and which only the prologue fills (constants)
    loop_writes = set().union(*(_writes(n) for n in m.loop.body), *(_writes(n) for n in m.tail))
    fill_of = {n.arg("dst"): n.attr("value") for n in m.prologue if n.op is Op.FILL}
    alloc, consumer_alloc, constants = [], [], []
    for n in m.head:
        if n.op is Op.LET:
            continue
        t, nm = types[n.result], n.result
        if nm in (a1, b1, b1t, b2):
            continue
        shape = [expr_text(d) for d in n.arg("shape")]
        if n.op is Op.SMEM and nm not in loop_writes:
            constants.append(n)
            continue
        refuse_unless(len(shape) == 2, f"`{nm}` is not a 2-D tile: the consumers hold (rows, N) and (rows, 1) tiles")
        value = fill_of.get(nm, n.attr("fill") if n.op is Op.RMEM else 0.0)
        fill = f", fill={fmt_attr(float(value))}" if float(value) != 0.0 else ""
        if const_of(p, n.arg("shape")[0]) == rows:
            consumer_alloc.append(f"{nm} = rmem({t.dtype.value}, ({shape[0]}, {shape[1]}){fill})")
        elif n.arg("shape")[0] == 1 and const_of(p, n.arg("shape")[1]) == keys:
            # a per-trip mask over the streamed tile's columns: a fragment of the trip's scores' shape
            consumer_alloc.append(f"{nm} = rmem({t.dtype.value}, ({rows}, {shape[1]}){fill})")
        else:
            raise Refused(f"`{nm}` {tuple(shape)} is written in the loop but is neither a (rows, N) tile, a "
                          "(rows, 1) row vector nor a (1, keys) mask the consumers could hold")
    alloc += [f"{a1} = smem({dt}, ({rows}, {SPAN}), stages={halves}, swizzle=128)",
              f"{b1} = smem({dt}, ({keys}, {SPAN}), stages={stages * halves}, swizzle=128)",
              f"{b2} = smem({dt}, ({keys}, {cols}), stages={stages}, swizzle=128)",
              f"{qf} = mbarrier(1)", f"{full} = mbarrier({S})", f"{full2} = mbarrier({S})",
              f"{empty} = mbarrier({S}, arrivals={wg})"]
    setup = [n for n in m.prologue if n.op is Op.FILL and n.arg("dst") in {c.result for c in constants}]

    # ---- producer: the resident halves once, then b1's halves and b2 per trip
    a1v, b1v, b2v = m.a1[1], m.b1[1], m.b2[1]
    producer = [f"expect_tx({qf}[0], {rows} * {SPAN * halves} * {nbytes})"]
    producer += [f"tma_load({a1}[{h}], {fmt_view(_half(a1v, h, halves))}, bar={qf}[0])" for h in range(halves)]
    # b1 and b2 land on barriers of their own: the first product and its epilogue run while b2 is in flight
    trip = [f"wait({empty}[{j} % {S}], phase=({j} // {S} + 1) % 2)",
            f"expect_tx({full}[{j} % {S}], {keys} * {SPAN * halves} * {nbytes})"]
    trip += [f"tma_load({b1}[{_slot(j, S, halves, h)}], {fmt_view(_half(b1v, h, halves))}, bar={full}[{j} % {S}])"
             for h in range(halves)]
    trip += [f"expect_tx({full2}[{j} % {S}], {keys} * {cols} * {nbytes})",
             f"tma_load({b2}[{j} % {S}], {fmt_view(b2v)}, bar={full2}[{j} % {S}])"]
    producer += [f"for {j} in range({extent}):"] + ["    " + s for s in trip]

    # ---- consumers: the loop's statements in order, the products as wgmma
    body: list[Node] = [stmt(f"wait({full}[{j} % {S}], phase={j} // {S} % 2)")]
    for n in m.loop.body:
        if n.op in (Op.LOAD, Op.SYNC) or n.op is Op.TRANSPOSE and n.arg("dst") == b1t:
            continue
        if n.op is Op.FILL and n.arg("dst") == acc1:
            continue
        if n is m.first:
            body += stmts("\n".join(
                f'wgmma({acc1}, {a1}[{h}], {b1}[{_slot(j, S, halves, h)}], b_major="k"'
                + (", accumulate=False)" if h == 0 else ")") for h in range(halves)) + "\nwgmma_wait(0)")
        elif n is m.second:
            body += stmts(f"wait({full2}[{j} % {S}], phase={j} // {S} % 2)\nwgmma({acc2}, {m.a2}, {b2}[{j} % {S}])\n"
                          f"wgmma_wait(0)\narrive({empty}[{j} % {S}])")
        else:
            body.append(n)
    loop_node = replace(stmt(f"for {j} in range({extent}):\n    sync()"), body=tuple(body))
    cons_body = stmts("\n".join(consumer_alloc)) + (stmt(f"wait({qf}[0], phase=0)"), loop_node) + \
        tuple(n for n in m.tail if n.op is not Op.SYNC)
    threads = 128 + 128 * wg
    prod = stmts("\n".join([f'with role("producer", warps=(0, 4), regs={PRODUCER_REGS}):']
                           + ["    " + s for s in producer]))
    cons = replace(stmt(f'with role("consumer", warps=(4, {4 + 4 * wg}), regs={CONSUMER_REGS}):\n    sync()'),
                   body=cons_body)
    lets = tuple(n for n in m.head if n.op is Op.LET)
    top = lets + tuple(constants) + stmts("\n".join(alloc)) + tuple(setup) + ((stmt("sync()"),) if setup else ())
    out = replace(p, threads=threads, body=top + prod + (cons,), ctas_per_sm=0)     # setmaxnreg roles own the SM
    return out.with_consts(**{rows: 64 * wg, keys: KEYS, S: stages})


__all__ = ["Chained", "find_chained", "warp_specialize_chained"]
