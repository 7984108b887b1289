"""Schedule tactics on warp-specialized programs: wgmma pipelining, ping-pong consumers, persistence.

Each is a local rewrite of a producer/consumer program (the form ``warp_specialize`` makes, or one
written by hand in the same vocabulary): it finds the roles by what they do (the producer copies, a
consumer issues wgmma), changes the part it names and leaves the rest as it is.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (Refused, map_exprs, namer, refuse_unless, set_attrs, stmt, stmts,
                                      subst_expr, walk_nodes, with_args)
from cake_core.agents.tactics_copy import _box_bytes, _slot_text
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols
from cake_core.ir.ops import REGISTRY, Node, Op, Slot, Tile, View, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view

BARRIER_OPS = (Op.WAIT, Op.ARRIVE, Op.EXPECT_TX)


def _is_consumer(n: Node) -> bool:
    return n.op is Op.ROLE and any(m.op is Op.WGMMA for m in walk_nodes(n.body))


def _is_producer(n: Node) -> bool:
    return n.op is Op.ROLE and any(m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) for m in walk_nodes(n.body))


def _barriers(p: Program) -> set[str]:
    return {n.result for n in walk_nodes(p.body) if n.op is Op.MBARRIER}


def _ring_const(slot_index: Expr, p: Program) -> str | None:
    """``S`` of a slot index ``... % S`` whose modulus is a program constant."""
    if isinstance(slot_index, Bin) and slot_index.op == "%" and isinstance(slot_index.b, Sym) \
            and slot_index.b.name in p.const_env:
        return slot_index.b.name
    return None


def _value(p: Program, e: Expr) -> int | None:
    if isinstance(e, int):
        return e
    if isinstance(e, Sym):
        return p.const_env.get(e.name)
    return None


# ------------------------------------------------------------------ batch_wgmma

def _release_tail(body: tuple[Node, ...]) -> tuple[Node, Node] | None:
    """The loop body's closing ``wgmma_wait(0); arrive(empty[...])`` pair, if it ends so."""
    if len(body) >= 2 and body[-2].op is Op.WGMMA_WAIT and body[-2].arg("n") == 0 and body[-1].op is Op.ARRIVE:
        return body[-2], body[-1]
    return None


def _map_role_loops(p: Program, pred, fn) -> tuple[Program, int]:
    """Apply ``fn`` to every FOR in a consumer role for which ``pred`` holds; returns (program, count)."""
    count = 0

    def walk(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        nonlocal count
        out: list[Node] = []
        for n in nodes:
            if n.body:
                n = replace(n, body=walk(n.body))
            if n.op is Op.FOR and pred(n):
                count += 1
                out.extend(fn(n))
            else:
                out.append(n)
        return tuple(out)

    body = tuple(replace(r, body=walk(r.body)) if _is_consumer(r) else r for r in p.body)
    return replace(p, body=body), count


def batch_wgmma(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Issue a candidate tile's wgmmas back to back and wait for them once.

    Before (each reduction step waits for its wgmma before the next is issued)::

        for dt in range(RD):
            it = kt * RD + dt
            wait(full[it % S], phase=it // S % 2)
            wgmma(dot, x_s[dt], c_s[it % S], b_major="k")
            wgmma_wait(0)
            arrive(empty[it % S])

    After (the tensor cores see RD wgmmas in flight; the slots are released once all have read them)::

        for dt in range(RD):
            it = kt * RD + dt
            wait(full[it % S], phase=it // S % 2)
            wgmma(dot, x_s[dt], c_s[it % S], b_major="k")
        wgmma_wait(0)
        for dt in range(RD):
            it = kt * RD + dt
            arrive(empty[it % S])

    Precondition: a consumer loop whose steps end with ``wgmma_wait(0); arrive(slot)``, with a static
    trip count no larger than the ring (a tile holds every slot it reads until its last wgmma: more trips
    than slots would deadlock). Applies to an argmin or a top-k epilogue contraction after ``resident``, and
    to any GEMM whose reduction is a static number of tiles.
    """
    def pred(n: Node) -> bool:
        tail = _release_tail(n.body)
        if tail is None or not any(m.op is Op.WGMMA for m in walk_nodes(n.body)):
            return False
        start, stop, step = loop_range(n)
        trips = _value(p, stop)
        slot = tail[1].arg("bar")
        ring = _ring_const(slot.index, p) if isinstance(slot, Slot) and slot.index is not None else None
        return start == 0 and step == 1 and trips is not None and ring is not None and trips <= p.const_env[ring]

    def fn(n: Node) -> tuple[Node, ...]:
        wait0, release = _release_tail(n.body)
        lets = tuple(m for m in n.body if m.op is Op.LET)
        issue = replace(n, body=n.body[:-2])
        free = replace(n, body=lets + (release,))
        return issue, wait0, free

    out, count = _map_role_loops(p, pred, fn)
    refuse_unless(count > 0, "no consumer loop with a static trip count within its ring waits for each wgmma "
                             "before the next (a dynamic reduction keeps its per-step wait)")
    return out


# ------------------------------------------------------------------ pipeline_wgmma

def pipeline_wgmma(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Keep one wgmma in flight across reduction steps: release a slot one step later.

    Before::

        for kt in range(cdiv(K, BK)):
            wait(full[kt % S], phase=kt // S % 2)
            wgmma(acc, a_s[kt % S], b_s[kt % S])
            wgmma_wait(0)
            arrive(empty[kt % S])

    After::

        for kt in range(cdiv(K, BK)):
            wait(full[kt % S], phase=kt // S % 2)
            wgmma(acc, a_s[kt % S], b_s[kt % S])
            wgmma_wait(1)
            if kt > 0:
                arrive(empty[(kt + S - 1) % S])
        wgmma_wait(0)
        arrive(empty[(cdiv(K, BK) - 1 + S) % S])

    Precondition: a consumer loop from 0 in steps of 1 whose steps end with ``wgmma_wait(0);
    arrive(ring[i % S])``. Applies to every contraction seed (a GEMM, an argmin or a top-k epilogue) after
    ``warp_specialize``.
    """
    def pred(n: Node) -> bool:
        tail = _release_tail(n.body)
        if tail is None or not any(m.op is Op.WGMMA for m in walk_nodes(n.body)):
            return False
        slot = tail[1].arg("bar")
        start, _, step = loop_range(n)
        return start == 0 and step == 1 and isinstance(slot, Slot) and slot.index is not None \
            and _ring_const(slot.index, p) is not None

    def fn(n: Node) -> tuple[Node, ...]:
        _, release = _release_tail(n.body)
        slot = release.arg("bar")
        ring = _ring_const(slot.index, p)
        count = slot.index.a              # the step's running count: slot = count % S
        var = n.arg("var")
        env = {m.arg("var"): m.arg("value") for m in n.body if m.op is Op.LET}
        last = subst_expr(subst_expr(count, env), {var: Bin("-", loop_range(n)[1], 1)})
        body = n.body[:-2] + stmts(f"wgmma_wait(1)\nif {var} > 0:\n"
                                   f"    arrive({slot.buf}[({fmt_expr(count)} + {ring} - 1) % {ring}])")
        return (replace(n, body=body),) + stmts(f"wgmma_wait(0)\narrive({slot.buf}[({fmt_expr(last)} + {ring}) % {ring}])")

    out, count = _map_role_loops(p, pred, fn)
    refuse_unless(count > 0, "no consumer loop whose steps end with wgmma_wait(0) and the slot's release")
    return out


# ------------------------------------------------------------------ pingpong

def _halve_rows(v: View, rows: str, half: int) -> View:
    idx = []
    hit = False
    for i in v.index:
        if isinstance(i, Tile) and i.size == Sym(rows):
            refuse_unless(not i.offset, f"the window {fmt_view(v)} starts at an offset (base=/limit=): its halves "
                                        "are not tiles of half the rows")
            idx.append(Tile(Bin("+", Bin("*", 2, i.index), half) if half else Bin("*", 2, i.index),
                            Bin("//", Sym(rows), 2)))
            hit = True
        else:
            idx.append(i)
    refuse_unless(hit, f"the window {fmt_view(v)} has no tile of {rows} rows to split")
    return View(v.buf, tuple(idx))


def pingpong(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split a two-warpgroup consumer into two one-warpgroup consumers that take turns on the tensor cores.

    Each consumer takes half of the accumulator's rows (its own half of the row operand, copied as two
    tiles) and every candidate tile; turn barriers order their wgmma issues, so while one runs its
    epilogue (the fused arg-min or top-k) the other's wgmmas keep the tensor cores busy.

    Before::

        x_s = smem(bf16, (BN, BD), stages=2, swizzle=128)
        with role("producer", warps=(0, 4), regs=40):
            ...
            tma_load(x_s[dt], x[bid.y, tile(bid.x, BN), tile(dt, BD)], bar=x_full[0])
        with role("consumer", warps=(4, 12), regs=232):
            dot = rmem(f32, (BN, BK))
            ...
            for kt in range(cdiv(K, BK)):
                for dt in range(RD):
                    ...
                    wgmma(dot, x_s[dt], c_s[it % S], b_major="k")
                wgmma_wait(0)
                ...
                argmin_bias(best, arg, dot, csq_s, base=kt * BK, limit=K)
            store(out[bid.y, tile(bid.x, BN)], arg)

    After::

        x_s0 = smem(bf16, (BN // 2, BD), stages=2, swizzle=128)
        x_s1 = smem(bf16, (BN // 2, BD), stages=2, swizzle=128)
        turn0 = mbarrier(1)
        turn1 = mbarrier(1)
        with role("producer", warps=(0, 4), regs=40):
            ...
            tma_load(x_s0[dt], x[bid.y, tile(2 * bid.x, BN // 2), tile(dt, BD)], bar=x_full[0])
            tma_load(x_s1[dt], x[bid.y, tile(2 * bid.x + 1, BN // 2), tile(dt, BD)], bar=x_full[0])
        with role("consumer0", warps=(4, 8), regs=232):
            dot0 = rmem(f32, (BN // 2, BK))
            ...
            for kt in range(cdiv(K, BK)):
                wait(turn0[0], phase=(kt + 1) % 2)
                for dt in range(RD):
                    ...
                    wgmma(dot0, x_s0[dt], c_s[it % S], b_major="k")
                arrive(turn1[0])
                wgmma_wait(0)
                ...
            store(out[bid.y, tile(2 * bid.x, BN // 2)], arg0)
        with role("consumer1", warps=(8, 12), regs=232):
            ...  (the same on rows BN // 2 .. BN, waiting on turn1 with parity kt % 2, arriving on turn0)

    Precondition: one consumer role of two warpgroups whose accumulator rows are a tile constant, a loop
    over candidate tiles in it (a per-tile epilogue to overlap: an argmin or a top-k epilogue), and row
    operands copied by the producer in tiles of those rows.
    """
    cons = [r for r in p.body if _is_consumer(r)]
    refuse_unless(len(cons) == 1, f"{len(cons)} consumer roles; ping-pong splits one")
    c = cons[0]
    lo, hi = c.arg("warps")
    refuse_unless(hi - lo == 8, "the consumer role is not two warpgroups")
    wgs = [m for m in walk_nodes(c.body) if m.op is Op.WGMMA]
    a_bufs = sorted({m.arg("a").buf for m in wgs})
    accs = sorted({m.arg("acc") for m in wgs})
    allocs = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    rows_e = allocs[accs[0]].arg("shape")[0]
    refuse_unless(isinstance(rows_e, Sym) and rows_e.name in p.const_env and p.const_env[rows_e.name] == 128,
                  "the accumulator's rows are not a tile constant of 128")
    rows = rows_e.name
    def issues_wgmma(n: Node) -> bool:
        return n.op is Op.FOR and any(k.op is Op.WGMMA for k in walk_nodes(n.body))

    def reduction_of(n: Node) -> Node | None:
        """The loop directly in ``n`` that issues the wgmmas and holds no such loop itself."""
        return next((m for m in n.body if issues_wgmma(m) and not any(issues_wgmma(k) for k in m.body)), None)

    # the candidate loop is at the top of the role, or inside a persistent tile loop
    loops = [n for n in c.body if n.op is Op.FOR]
    loops += [m for n in loops for m in n.body if m.op is Op.FOR]
    cand = next((n for n in loops if reduction_of(n) is not None), None)
    refuse_unless(cand is not None, "no loop over candidate tiles around the consumer's reduction: nothing to "
                                    "overlap the other consumer's tensor-core work with")
    red_loop = reduction_of(cand)
    trips = _value(p, loop_range(red_loop)[1])
    ring = next((_ring_const(m.arg("bar").index, p) for m in walk_nodes(red_loop.body)
                 if m.op is Op.WAIT and m.arg("bar").index is not None), None)
    refuse_unless(trips is not None and ring is not None and trips <= p.const_env[ring],
                  "a candidate tile's reduction is not a static number of ring slots within the ring: the other "
                  "consumer reads the same slots after its turn, so a tile must fit the ring (see resident)")
    for b in a_bufs:
        refuse_unless(allocs[b].arg("shape")[0] == rows_e, f"`{b}` does not hold the accumulator's rows")
    name = namer(p)

    halves = {b: (name(f"{b}0"), name(f"{b}1")) for b in a_bufs}
    role_rmem = [m for m in walk_nodes(c.body) if m.op is Op.RMEM]
    for m in role_rmem:
        refuse_unless(m.arg("shape")[0] == rows_e, f"the consumer's rmem `{m.result}` is not a tile of {rows} rows")
    rnames = {m.result: (name(f"{m.result}0"), name(f"{m.result}1")) for m in role_rmem}
    turn = (name("turn0"), name("turn1"))
    half_rows = Bin("//", Sym(rows), 2)

    # -- the count of candidate tiles taken so far (continuing across a persistent tile loop)
    cvar = cand.arg("var")
    j: Expr = Sym(cvar)
    outer = next((n for n in c.body if n.op is Op.FOR and cand in n.body), None)
    if outer is not None:
        s0, _, st = loop_range(outer)
        j = Bin("+", Bin("*", Bin("//", Bin("-", Sym(outer.arg("var")), s0), st), loop_range(cand)[1]), j)

    def rename_node(n: Node, half: int) -> Node:
        mapping = {k: v[half] for k, v in {**halves, **rnames}.items()}

        def fix(m: Node) -> Node:
            args = []
            for kind, a in zip((o.kind for o in REGISTRY[m.op].operands), m.args):
                if kind == "buf" and a in mapping:
                    a = mapping[a]
                elif kind == "slot" and isinstance(a, Slot) and a.buf in mapping:
                    a = Slot(mapping[a.buf], a.index)
                elif kind == "shape" and m.op is Op.RMEM and a and a[0] == rows_e:
                    a = (half_rows,) + tuple(a[1:])
                elif kind == "view" and m.op is Op.STORE:
                    a = _halve_rows(a, rows, half)
                args.append(a)
            res = mapping.get(m.result, m.result) if m.result else m.result
            return replace(m, args=tuple(args), result=res, body=tuple(fix(b) for b in m.body))
        return fix(n)

    def with_turns(nodes: tuple[Node, ...], half: int) -> tuple[Node, ...]:
        out = []
        for n in nodes:
            if n is cand:
                mine, other = turn[half], turn[1 - half]
                phase = fmt_expr(Bin("%", Bin("+", j, 1) if half == 0 else j, 2))
                body = list(n.body)
                red = next(i for i, m in enumerate(body) if issues_wgmma(m))
                pass_turn = stmt(f"arrive({other}[0])")
                # pass the turn once this tile's wgmmas are issued: before the wait that follows them
                at = red + 1
                body.insert(at, pass_turn)
                n = replace(n, body=(stmt(f"wait({mine}[0], phase={phase})"),) + tuple(body))
            elif n.body:
                n = replace(n, body=with_turns(n.body, half))
            out.append(n)
        return tuple(out)

    roles = []
    for half in (0, 1):
        body = with_turns(c.body, half)
        body = tuple(rename_node(m, half) for m in body)
        roles.append(replace(with_args(c, name=f"{c.arg('name')}{half}", warps=(lo + 4 * half, lo + 4 * half + 4)),
                             body=body))

    def fix_producer(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        out = []
        for n in nodes:
            if n.body:
                n = replace(n, body=fix_producer(n.body))
            if n.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) and n.arg("dst").buf in halves:
                dst = n.arg("dst")
                for h in (0, 1):
                    out.append(with_args(n, dst=Slot(halves[dst.buf][h], dst.index),
                                         src=_halve_rows(n.arg("src"), rows, h)))
                continue
            out.append(n)
        return tuple(out)

    new_body: list[Node] = []
    for n in p.body:
        if n.op is Op.SMEM and n.result in halves:
            for h in (0, 1):
                new_body.append(replace(with_args(n, shape=(half_rows,) + n.arg("shape")[1:]),
                                        result=halves[n.result][h]))
            continue
        if n is c:
            new_body += roles
            continue
        if _is_producer(n):
            n = replace(n, body=fix_producer(n.body))
        new_body.append(n)
    first_role = next(i for i, n in enumerate(new_body) if n.op is Op.ROLE)
    new_body[first_role:first_role] = [stmt(f"{turn[0]} = mbarrier(1)"), stmt(f"{turn[1]} = mbarrier(1)")]
    return replace(p, body=tuple(new_body))


# ------------------------------------------------------------------ consumer warpgroups

def consumer_warpgroups(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Give the consumer role twice (or half) the warpgroups, over twice (or half) the accumulator's rows.

    wgmma gives each warpgroup 64 rows of the accumulator, so a one-warpgroup consumer computes a 64-row
    tile: per CTA, each operand tile the producer copies feeds half the tensor-core work it would feed
    two warpgroups. This rewrite moves the row tile constant with the warpgroups (64 <-> 128), the
    CTA's threads with the role, and the arrival count of every barrier the consumer arrives on (one
    arrival per warpgroup), so the same ring now serves 128-row tiles (or, going back, 64-row ones).

    Before::

        @kernel(..., threads=256, consts={"BM": 64, "BN": 256, ...})
        ...
        empty = mbarrier(S)
        with role("producer", warps=(0, 4), regs=40):
            ...
        with role("consumer", warps=(4, 8), regs=232):
            acc = rmem(f32, (BM, BN))
            ...
            arrive(empty[(it + S - 1) % S])

    After::

        @kernel(..., threads=384, consts={"BM": 128, "BN": 256, ...})
        ...
        empty = mbarrier(S, arrivals=2)
        with role("producer", warps=(0, 4), regs=40):
            ...
        with role("consumer", warps=(4, 12), regs=232):
            acc = rmem(f32, (BM, BN))
            ...
            arrive(empty[(it + S - 1) % S])

    Precondition: one consumer role (it issues wgmma) of one or two warpgroups, the last role of the CTA;
    its accumulators' rows are one tile constant of 64 per warpgroup; every barrier it arrives on counts
    one arrival per consumer warpgroup. Applies to every warp-specialized contraction (a GEMM, an argmin
    or a top-k epilogue).
    """
    cons = [r for r in p.body if _is_consumer(r)]
    refuse_unless(len(cons) == 1, f"{len(cons)} consumer roles; this rewrite widens or narrows one")
    c = cons[0]
    lo, hi = c.arg("warps")
    wg = (hi - lo) // 4
    refuse_unless((hi - lo) % 4 == 0 and wg in (1, 2), f"the consumer role has {hi - lo} warps, not one or "
                                                         "two warpgroups")
    later = [r for r in p.body if r.op is Op.ROLE and r is not c and r.arg("warps")[0] >= hi]
    refuse_unless(not later, f"role `{later[0].arg('name') if later else ''}` follows the consumer's warps")
    allocs = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    bars = {n.result: n for n in p.body if n.op is Op.MBARRIER}
    accs = {m.arg("acc") for m in walk_nodes(c.body) if m.op is Op.WGMMA}
    rows = {allocs[a].arg("shape")[0] for a in accs if a in allocs}
    refuse_unless(len(rows) == 1, "the consumer's accumulators do not share one row extent")
    rows_e = next(iter(rows))
    refuse_unless(isinstance(rows_e, Sym) and p.const_env.get(rows_e.name) == 64 * wg,
                  f"the accumulator's rows are not a tile constant of {64 * wg} ({wg} warpgroup(s) x 64)")
    new_wg = 3 - wg
    arrived = {m.arg("bar").buf for m in walk_nodes(c.body) if m.op is Op.ARRIVE and isinstance(m.arg("bar"), Slot)}
    for b in sorted(arrived):
        refuse_unless(b in bars, f"the consumer arrives on `{b}`, not an mbarrier of the kernel's top level")
        refuse_unless((bars[b].attr("arrivals") or 1) == wg, f"barrier `{b}` counts {bars[b].attr('arrivals') or 1}"
                                                             f" arrivals, not one per consumer warpgroup ({wg})")

    def fix(n: Node) -> Node:
        if n.op is Op.MBARRIER and n.result in arrived:
            return set_attrs(n, arrivals=new_wg)
        if n is c:
            return with_args(n, warps=(lo, lo + 4 * new_wg))
        return n

    body = tuple(fix(n) for n in p.body)
    return replace(p, body=body, threads=p.threads + 128 * (new_wg - wg)).with_consts(**{rows_e.name: 64 * new_wg})
