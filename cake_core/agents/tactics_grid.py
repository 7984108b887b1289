"""Grid tactics: split-K over a new grid dimension, and a grouped order of a two-dimensional grid's tiles.

``split_k`` gives each CTA a share of the reduction and adds its partial sum into the zeroed output;
``group_tiles`` walks the tiles in groups of tile rows so that CTAs launched together share operand panels in
L2. The persistent grid is ``tactics_persistent``'s, the cluster tactics are ``tactics_cluster``'s.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (fresh, map_exprs, node_syms, refuse_unless, stmt, subst_view, walk_nodes,
                                      with_args)
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr
from cake_core.ir.ops import REGISTRY, Node, Op, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view


# ------------------------------------------------------------------ split-K

SPLITS = (2, 4, 8)


def split_k(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split the reduction over a new grid dimension; each CTA adds its partial sum into the zeroed output.

    Before (warp-specialized GEMM: one CTA per output tile walks all of K)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
            for kt in range(cdiv(K, BK)):
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
            ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After (SPLIT CTAs per tile along z, each a share of the K tiles)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM), SPLIT), ...)
            for kt in range(max(min(cdiv(cdiv(K, BK), SPLIT), cdiv(K, BK) - bid.z * cdiv(cdiv(K, BK), SPLIT)), 0)):
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(bid.z * cdiv(cdiv(K, BK), SPLIT) + kt, BK)], ...)
            ...
            atomic_add(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    For outputs the harness zeroes before each launch (the zeroing is timed with the kernel): a small-M
    GEMM whose tiles alone cannot fill the GPU. Precondition: warp roles whose ring loop is the reduction
    (no candidate loop), a grid of at most two dimensions, no tile loop or cluster, the accumulator stored
    once. Applies to a GEMM's seed after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(len(p.grid) <= 2, "the grid already has three dimensions")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    roles = [n for n in p.body if n.op is Op.ROLE]
    loops = []
    for r in roles:
        ls = [n for n in r.body if n.op is Op.FOR]
        refuse_unless(len(ls) == 1, f"role {r.arg('name')} has {len(ls)} top-level loops, not one reduction loop")
        refuse_unless(not any(m.op is Op.FOR for m in ls[0].body), "the reduction loop holds a loop (a candidate "
                                                                   "loop's epilogue would be split too)")
        loops.append(ls[0])
    stops = {fmt_expr(loop_range(lp)[1]) for lp in loops}
    refuse_unless(len(stops) == 1, "the roles' loops do not share one extent")
    stores = [n for r in roles for n in walk_nodes(r.body) if n.op is Op.STORE]
    accs = {n.arg("acc") for r in roles for n in walk_nodes(r.body) if n.op is Op.WGMMA}
    refuse_unless(len(stores) == 1 and stores[0].arg("src") in accs, "the accumulator is not stored once")
    split = fresh(p, "SPLIT")
    extent = loop_range(loops[0])[1]
    ch = Call("cdiv", (extent, Sym(split)))
    z = Sym(f"bid.{'xyz'[len(p.grid)]}")
    share = Call("max", (Call("min", (ch, Bin("-", extent, Bin("*", z, ch)))), 0))

    def fix_views(n: Node, var: str) -> Node:
        kinds = [o.kind for o in REGISTRY[n.op].operands]
        env = {var: Bin("+", Bin("*", z, ch), Sym(var))}
        args = tuple(subst_view(a, env) if k == "view" else a for k, a in zip(kinds, n.args))
        return replace(n, args=args, body=tuple(fix_views(b, var) for b in n.body))

    def fix_role(r: Node) -> Node:
        out = []
        for n in r.body:
            if n.op is Op.FOR:
                n = with_args(fix_views(n, n.arg("var")), extent=share)
            elif n.op is Op.STORE:
                n = stmt(f"atomic_add({fmt_view(n.arg('dst'))}, {n.arg('src')})")
            out.append(n)
        return replace(r, body=tuple(out))

    body = tuple(fix_role(n) if n.op is Op.ROLE else n for n in p.body)
    return replace(p, grid=p.grid + (Sym(split),), body=body).with_consts(**{split: int(rng.choice(SPLITS))})


# ------------------------------------------------------------------ grouped tile order

GROUPS = (4, 8, 16)


def group_tiles(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Launch a two-dimensional grid of tiles as one dimension walked in groups of G tile rows.

    CTAs launched together then share G row panels of one operand and a few column panels of the other, so
    those stay in L2 while they are read (row-major order streams a whole row of column panels first).

    Before::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
            ... a[tile(bid.y, BM), tile(kt, BK)] ... b[tile(kt, BK), tile(bid.x, BN)] ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After (``t`` = bid.x of the one-dimensional grid; ``gy`` = cdiv(M, BM), ``gx`` = cdiv(N, BN))::

        @kernel(grid=(cdiv(N, BN) * cdiv(M, BM),), consts={..., "G": 16})
            row = t // (G * gx) * G + t % (G * gx) % min(gy - t // (G * gx) * G, G)
            col = t % (G * gx) // min(gy - t // (G * gx) * G, G)
            ... a[tile(row, BM), ...] ... b[..., tile(col, BN)] ... store(c[tile(row, BM), tile(col, BN)], acc)

    (written out where ``bid.y`` and ``bid.x`` were). A later ``persistent`` walks the same order. Precondition:
    a grid of exactly two dimensions, no cluster, no tile loop, bid.z unused. Applies to a GEMM and to an
    argmin-epilogue contraction (CTA-collective or warp-specialized).
    """
    refuse_unless(len(p.grid) == 2, f"a grid of {len(p.grid)} dimensions, not two")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) or "bid.z" in node_syms(n) for n in walk_nodes(p.body)),
                  "a tile loop or a third grid coordinate")
    g = fresh(p, "G")
    gx, gy = p.grid
    t = Sym("bid.x")
    span = Bin("*", Sym(g), gx)
    first = Bin("*", Bin("//", t, span), Sym(g))
    height = Call("min", (Bin("-", gy, first), Sym(g)))
    row = Bin("+", first, Bin("%", Bin("%", t, span), height))
    col = Bin("//", Bin("%", t, span), height)
    # substitute both coordinates at once: bid.x appears inside the new expressions
    body = tuple(map_exprs(n, lambda e: _swap_coords(e, row, col)) for n in p.body)
    return replace(p, grid=(Bin("*", gx, gy),), body=body).with_consts(**{g: int(rng.choice(GROUPS))})


def _swap_coords(e: Expr, row: Expr, col: Expr) -> Expr:
    if isinstance(e, Sym):
        return row if e.name == "bid.y" else col if e.name == "bid.x" else e
    if isinstance(e, Bin):
        return Bin(e.op, _swap_coords(e.a, row, col), _swap_coords(e.b, row, col))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_swap_coords(a, row, col) for a in e.args))
    from cake_core.ir.expr import Cmp
    if isinstance(e, Cmp):
        return Cmp(e.op, _swap_coords(e.a, row, col), _swap_coords(e.b, row, col))
    return e
