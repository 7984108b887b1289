"""The persistent grid: one CTA per SM walking the output tiles, on warp-specialized programs.

``persistent`` launches one CTA per SM (``min(tiles, num_sms)``) and has every role walk the output tiles
``t = bid.x, bid.x + ncta.x, ...``: the CTA's barriers and rings stay initialised across tiles, the
producer fills the next tile's ring slots while the consumers finish the last one, and no CTA waits in a
tail wave behind a full one. Every ring's slot and phase count continues across tiles (a running count),
and operands kept resident for a tile get a second buffer so the next tile's copy can land early.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (map_exprs, namer, node_syms, refuse_unless, stmt, stmts, subst_expr, trips_past,
                                      view_syms, walk_nodes, with_args)
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols
from cake_core.ir.ops import REGISTRY, Node, Op, Slot, loop_range
from cake_core.ir.program import Program


# ops whose `bar` operand names an mbarrier slot (a ring's, or a barrier waited once)
_BAR_SLOT_OPS = frozenset({Op.WAIT, Op.ARRIVE, Op.EXPECT_TX, Op.TMA_LOAD, Op.CP_ASYNC_BAR})


def _tile_coords(grid: tuple[Expr, ...], t: Expr) -> dict[str, Expr]:
    """bid.x, bid.y, bid.z of linear tile ``t`` over ``grid`` (x fastest)."""
    out: dict[str, Expr] = {}
    stride: Expr = 1
    for axis, g in zip("xyz", grid):
        q = t if stride == 1 else Bin("//", t, stride)
        out[f"bid.{axis}"] = q if axis == "xyz"[len(grid) - 1] else Bin("%", q, g)
        stride = g if stride == 1 else Bin("*", stride, g)
    return out


def _tiles(grid: tuple[Expr, ...]) -> Expr:
    total: Expr = grid[0]
    for g in grid[1:]:
        total = Bin("*", total, g)
    return total


def _let_names_in_views(nodes: tuple[Node, ...]) -> set[str]:
    """Names (bindings, loop variables) that some view or ring-data slot of ``nodes`` uses."""
    out: set[str] = set()
    for n in walk_nodes(nodes):
        for kind, a in zip((o.kind for o in REGISTRY[n.op].operands), n.args):
            if kind == "view":
                out |= view_syms(a)
    return out


def persistent(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Turn a grid of one CTA per output tile into a persistent grid walking the tiles.

    Before (warp-specialized GEMM)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
        with role("producer", warps=(0, 4), regs=40):
            for kt in range(cdiv(K, BK)):
                wait(empty[kt % S], phase=(kt // S + 1) % 2)
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
        with role("consumer", warps=(4, 12), regs=232):
            acc = rmem(f32, (BM, BN))
            for kt in range(cdiv(K, BK)):
                wait(full[kt % S], phase=kt // S % 2)
                ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After::

        @kernel(grid=(min(cdiv(N, BN) * cdiv(M, BM), num_sms),), ...)
        with role("producer", warps=(0, 4), regs=40):
            for t in range(bid.x, cdiv(N, BN) * cdiv(M, BM), ncta.x):
                for kt in range(cdiv(K, BK)):
                    wait(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=...)
                    ...
                    tma_load(a_s[...], a[tile(t // cdiv(N, BN), BM), tile(kt, BK)], bar=full[...])
        with role("consumer", warps=(4, 12), regs=232):
            for t in range(bid.x, cdiv(N, BN) * cdiv(M, BM), ncta.x):
                acc = rmem(f32, (BM, BN))
                for kt in range(cdiv(K, BK)):
                    wait(full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=...)
                    ...
                store(c[tile(t // cdiv(N, BN), BM), tile(t % cdiv(N, BN), BN)], acc)

    A barrier waited once per kernel (a resident operand's ``x_full[0]``, phase 0) becomes a two-slot ring
    per tile with an ``x_empty`` the consumers arrive on after the tile; the resident tiles get a second set
    of slots. Precondition: warp roles only at the top level (after allocations), a grid of one CTA per
    tile (no tile loop yet, no cluster), each role's work one top-level loop. Applies to every contraction
    seed (a GEMM, an argmin or a top-k epilogue) after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles: persistence walks tiles in a producer and "
                                                         "its consumers")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) or "num_sms" in node_syms(n) for n in walk_nodes(p.body)) and
                  not any("num_sms" in symbols(g) for g in p.grid), "the kernel already walks tiles (ncta / num_sms)")
    first_role = next(i for i, n in enumerate(p.body) if n.op is Op.ROLE)
    refuse_unless(all(n.op in (Op.SMEM, Op.RMEM, Op.MBARRIER, Op.LET, Op.ROLE) or (
        i < first_role and n.op in (Op.FILL, Op.SYNC) and not any(s.startswith("bid.") for s in node_syms(n)))
        for i, n in enumerate(p.body)),
        "statements outside the roles besides allocations and, before the roles, fills of constants")
    name = namer(p)

    t = name("t")
    tiles = _tiles(p.grid)
    coords = _tile_coords(p.grid, Sym(t))
    lt = Bin("//", Bin("-", Sym(t), Sym("bid.x")), Sym("ncta.x"))       # tiles this CTA walked before t
    bars = {n.result for n in p.body if n.op is Op.MBARRIER}
    once = _once_barriers(p, bars)       # waited once per kernel: a resident operand's
    resident = _resident_bufs(p, once)
    empties = {b: name(b.replace("full", "empty") if "full" in b else f"{b}_empty") for b in once}
    cons_wg = sum((r.arg("warps")[1] - r.arg("warps")[0]) // 4 for r in p.body if r.op is Op.ROLE
                  and any(m.op is Op.WGMMA for m in walk_nodes(r.body)))

    per_tile = _consumer_trips(p, bars - once)

    def role_body(r: Node) -> tuple[Node, ...]:
        # the role's ring loop: the top-level loop whose waits or copies use a ring (not a once barrier)
        ring_loops = [n for n in r.body if n.op is Op.FOR and any(
            m.op in _BAR_SLOT_OPS and m.arg("bar").buf in bars - once for m in walk_nodes(n.body))]
        refuse_unless(len(ring_loops) <= 1, f"role {r.arg('name')} runs its rings in {len(ring_loops)} top-level loops")
        count: dict[str, Expr] = {}
        if ring_loops:
            lp = ring_loops[0]
            s0, stop, st = loop_range(lp)
            refuse_unless(s0 == 0 and st == 1, "a role's ring loop does not count from 0 in steps of 1")
            refuse_unless(trips_past(stop, per_tile) is not None, f"role {r.arg('name')}'s ring loop runs "
                          f"{fmt_expr(stop)} trips, not the consumers' {fmt_expr(per_tile)} (or a few more)")
            # every role counts tiles by the consumers' trips, a lagged producer's extra trip included
            count = {lp.arg("var"): Bin("+", Bin("*", lt, per_tile), Sym(lp.arg("var")))}
        view_names = _let_names_in_views(r.body)
        body = tuple(map_exprs(n, lambda e: subst_expr(e, coords)) for n in r.body)
        if ring_loops:
            # inside the ring loop its variable becomes the running count; a ring slot named after the loop
            # (pipeline_wgmma's last release) is offset by the tiles walked before
            offset = Bin("*", lt, per_tile)
            body = tuple(_bar_exprs(n, bars, count, view_names) if n.op is Op.FOR and n.arg("var") == lp.arg("var")
                         else _offset_ring_slots(n, bars - once, offset) for n in body)
        if once:
            body = _ring_once(body, once, empties, resident, lt, producer=_is_prod(r))
        return body

    new_body: list[Node] = []
    for n in p.body:
        if n.op is Op.ROLE:
            body = role_body(n)
            loop = stmts(f"for {t} in range(bid.x, {fmt_expr(tiles)}, ncta.x):\n    pass")[0]
            new_body.append(replace(n, body=(replace(loop, body=body),)))
        elif n.op is Op.MBARRIER and n.result in once:
            new_body += [stmt(f"{n.result} = mbarrier(2)"),
                         stmt(f"{empties[n.result]} = mbarrier(2, arrivals={cons_wg})")]
        elif n.op is Op.SMEM and n.result in resident:
            new_body.append(replace(n, attrs=tuple(sorted({**dict(n.attrs), "stages": 2 * n.attr("stages")}.items()))))
        else:
            new_body.append(n)
    grid = (Call("min", (tiles, Sym("num_sms"))),)
    return replace(p, grid=grid, body=tuple(new_body))


def _consumer_trips(p: Program, rings: set[str]) -> Expr | None:
    """The extent of the consumers' ring loop (None without one)."""
    for r in p.body:
        if r.op is Op.ROLE and any(m.op is Op.WGMMA for m in walk_nodes(r.body)):
            for n in r.body:
                if n.op is Op.FOR and any(m.op in _BAR_SLOT_OPS and m.arg("bar").buf in rings
                                          for m in walk_nodes(n.body)):
                    return loop_range(n)[1]
    return None


def _is_prod(r: Node) -> bool:
    return any(m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) for m in walk_nodes(r.body))


def _once_barriers(p: Program, bars: set[str]) -> set[str]:
    """Barriers every wait of which is at a role's top level with a constant slot and phase 0."""
    out = set()
    for b in bars:
        waits = [(r, n) for r in p.body if r.op is Op.ROLE for n in walk_nodes(r.body)
                 if n.op is Op.WAIT and n.arg("bar").buf == b]
        if waits and all(n in r.body and n.arg("phase") == 0 and n.arg("bar").index == 0 for r, n in waits):
            out.add(b)
    return out


def _resident_bufs(p: Program, once: set[str]) -> dict[str, int]:
    """The smem tiles filled through a once-waited barrier, with their stage counts."""
    bufs = {n.arg("dst").buf for n in walk_nodes(p.body) if n.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR)
            and n.arg("bar").buf in once}
    return {n.result: n.attr("stages") for n in p.body if n.op is Op.SMEM and n.result in bufs}


def _bar_exprs(n: Node, bars: set[str], count: dict[str, Expr], view_names: set[str]) -> Node:
    """Continue ring counts across tiles: the role loop's variable becomes its running count in barrier
    slots and phases, in ring-data slots indexed by a barrier's count, and in bindings only such use."""
    if not count:
        return n

    def slot_fix(a, kind: str):
        if kind == "slot" and isinstance(a, Slot) and a.index is not None:
            return Slot(a.buf, subst_expr(a.index, count))
        return a

    def fix(m: Node) -> Node:
        if m.op is Op.LET and m.arg("var") not in view_names:
            m = with_args(m, value=subst_expr(m.arg("value"), count))
        elif m.op is Op.WAIT and m.arg("bar").buf in bars:
            m = with_args(m, bar=slot_fix(m.arg("bar"), "slot"), phase=subst_expr(m.arg("phase"), count))
        elif m.op in _BAR_SLOT_OPS or m.op in (Op.WGMMA, Op.ARGMIN_BIAS, Op.TOPK_BIAS, Op.TOPK_SHIFT,
                                                   Op.SQNORM_ROWS):
            kinds = [o.kind for o in REGISTRY[m.op].operands]
            m = replace(m, args=tuple(slot_fix(a, k) for k, a in zip(kinds, m.args)))
        return replace(m, body=tuple(fix(b) for b in m.body))

    return fix(n)


def _offset_ring_slots(n: Node, rings: set[str], offset: Expr) -> Node:
    """A ring slot ``c % S`` named outside the ring loop becomes ``(offset + c) % S``."""
    kinds = [o.kind for o in REGISTRY[n.op].operands]
    args = []
    for k, a in zip(kinds, n.args):
        if k == "slot" and isinstance(a, Slot) and a.buf in rings and isinstance(a.index, Bin) and a.index.op == "%":
            a = Slot(a.buf, Bin("%", Bin("+", offset, a.index.a), a.index.b))
        args.append(a)
    return replace(n, args=tuple(args), body=tuple(_offset_ring_slots(b, rings, offset) for b in n.body))


def _ring_once(body: tuple[Node, ...], once: set[str], empties: dict[str, str], resident: dict[str, int],
               lt: Expr, producer: bool) -> tuple[Node, ...]:
    """Per-tile barriers for what was waited once per kernel: slot lt % 2, parity lt // 2 % 2; the producer
    waits for the consumers to release the slot before its first copy; resident tiles of a tile sit in its
    half of the (doubled) slots."""
    ltx = fmt_expr(lt)

    def res_slot(m: Node) -> Node:
        kinds = [o.kind for o in REGISTRY[m.op].operands]
        args = []
        for k, a in zip(kinds, m.args):
            if k == "slot" and isinstance(a, Slot) and a.index is not None:
                if a.buf in resident:
                    a = Slot(a.buf, Bin("+", Bin("*", Bin("%", lt, 2), resident[a.buf]), a.index))
                elif a.buf in once:
                    a = Slot(a.buf, Bin("%", lt, 2))
            args.append(a)
        return replace(m, args=tuple(args), body=tuple(res_slot(b) for b in m.body))

    def fills_once(n: Node) -> bool:
        return any((m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR, Op.EXPECT_TX) and m.arg("bar").buf in once)
                   for m in walk_nodes((n,)))

    out: list[Node] = []
    waited = False
    for n in body:
        if n.op is Op.WAIT and n.arg("bar").buf in once:
            out.append(stmt(f"wait({n.arg('bar').buf}[{ltx} % 2], phase={ltx} // 2 % 2)"))
            continue
        if producer and not waited and fills_once(n):
            out += [stmt(f"wait({empties[b]}[{ltx} % 2], phase=({ltx} // 2 + 1) % 2)") for b in sorted(once)]
            waited = True
        out.append(res_slot(n))
    if not producer:
        out += [stmt(f"arrive({empties[b]}[{ltx} % 2])") for b in sorted(once)]
    return tuple(out)
