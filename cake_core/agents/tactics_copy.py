"""Copy-engine tactics on warp-specialized programs: TMA for cp.async, resident operands.

``tma``: every group of ``cp_async_bar`` copies that completes on one barrier, with the role's
``arrive`` on that barrier in the same block, becomes ``expect_tx`` of the group's box bytes and
``tma_load`` copies (the bulk tensor engine: one thread issues a whole box, the bytes complete the
barrier's phase, no arrival per warpgroup). Once no cp.async copy is left, the ``fence_async()`` that
ordered cp.async's generic-proxy writes before wgmma's async-proxy reads goes too. TMA needs 16-byte
aligned global strides (a bf16 row of D elements: D % 8 == 0); the kernel's domain says so and the gate
refuses other shapes before launch.

Before::

    wait(empty[it % S], phase=(it // S + 1) % 2)
    cp_async_bar(x_s[it % S], x[bid.y, tile(bid.x, BN), tile(dt, BD)], bar=full[it % S])
    cp_async_bar(c_s[it % S], c[bid.y, tile(kt, BK), tile(dt, BD)], bar=full[it % S])
    arrive(full[it % S])
    ...
    wait(full[it % S], phase=it // S % 2)
    fence_async()
    wgmma(...)

After::

    wait(empty[it % S], phase=(it // S + 1) % 2)
    expect_tx(full[it % S], BN * BD * 2 + BK * BD * 2)
    tma_load(x_s[it % S], x[bid.y, tile(bid.x, BN), tile(dt, BD)], bar=full[it % S])
    tma_load(c_s[it % S], c[bid.y, tile(kt, BK), tile(dt, BD)], bar=full[it % S])
    ...
    wait(full[it % S], phase=it // S % 2)
    wgmma(...)

An N-major ``b`` operand that cp.async fills has rows of one 128-byte swizzle span, which pins wgmma's N to 64
16-bit columns (a GEMM's seed after ``warp_specialize``: ``BN = 64``); TMA's boxes lift that, so the rewrite also
draws that N among the widths wgmma takes (64, 128, 192, 256): the copy engine and the tile that it allows
change in one step, as neither pays alone.

A loop of a static trip count that only copies into the same barrier (a resident operand's tiles, when
``resident`` came first) belongs to the group: its bytes count once per trip.

Precondition: a group of ``cp_async_bar`` copies on one barrier with the role's ``arrive`` on it after them in
the same block, and no other smem write (``sqnorm_rows``) that the arrive also publishes. Applies to every
warp-specialized program with cp.async producers (every contraction seed, a GEMM or an argmin or top-k
epilogue, after ``warp_specialize``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (Refused, fresh, map_exprs, refuse_unless, replace_expr, stmt, stmts, subst_expr,
                                      view_syms, walk_nodes, with_args)
from cake_core.agents.tactics_ws import WGMMA_N, wgmma_consts
from cake_core.ir.expr import Bin, Sym, fmt_expr, symbols, try_evaluate
from cake_core.ir.ops import Node, Op, Slot, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view


def _slot_text(s: Slot) -> str:
    return s.buf if s.index is None else f"{s.buf}[{fmt_expr(s.index)}]"


def _box_bytes(p: Program, dst: Slot) -> str:
    """The bytes of one slot of ``dst``'s tile, as an index expression's text."""
    alloc = next(n for n in walk_nodes(p.body) if n.op is Op.SMEM and n.result == dst.buf)
    dims = " * ".join(fmt_expr(d) for d in alloc.arg("shape"))
    return f"{dims} * {alloc.arg('dtype').bytes}"


def _publishes_other_writes(nodes: tuple[Node, ...]) -> bool:
    """Whether these nodes write smem that an arrive after them publishes (besides the copies)."""
    return any(m.op is Op.SQNORM_ROWS for n in nodes for m in walk_nodes((n,)))


def _loop_of_copies(p: Program, n: Node) -> tuple[Slot, str] | None:
    """A loop of a static trip count whose body is only cp_async_bar copies on one barrier that the loop does
    not index (a resident operand's tiles, copied before the candidate loop): that barrier, and the bytes of
    all its trips."""
    if n.op is not Op.FOR or not n.body or any(m.op is not Op.CP_ASYNC_BAR for m in n.body):
        return None
    bars = {m.arg("bar") for m in n.body}
    bar = next(iter(bars))
    start, stop, step = loop_range(n)
    static = isinstance(stop, int) or (isinstance(stop, Sym) and stop.name in p.const_env)
    if len(bars) != 1 or start != 0 or step != 1 or not static or \
            (bar.index is not None and n.arg("var") in symbols(bar.index)):
        return None
    per = " + ".join(_box_bytes(p, m.arg("dst")) for m in n.body)
    return bar, f"({per}) * {fmt_expr(stop)}"


def _tma_block(p: Program, nodes: tuple[Node, ...]) -> tuple[tuple[Node, ...], bool]:
    changed = False
    inner = []
    for n in nodes:
        if n.body:
            body, c = _tma_block(p, n.body)
            changed |= c
            n = replace(n, body=body)
        inner.append(n)
    nodes = tuple(inner)
    groups: dict[Slot, list[int]] = {}
    arrives: dict[Slot, int] = {}
    loops: dict[int, tuple[Slot, str]] = {}     # a loop of copies in a group: its barrier, the bytes of its trips
    for i, n in enumerate(nodes):
        if n.op is Op.CP_ASYNC_BAR:
            groups.setdefault(n.arg("bar"), []).append(i)
        elif (lc := _loop_of_copies(p, n)) is not None:
            groups.setdefault(lc[0], []).append(i)
            loops[i] = lc
        elif n.op is Op.ARRIVE and n.arg("bar") in groups and not n.attr("multicast"):
            arrives.setdefault(n.arg("bar"), i)
    convert = {bar for bar, idx in groups.items()
               if bar in arrives and idx[-1] < arrives[bar]
               and not _publishes_other_writes(nodes[idx[0]:arrives[bar]])}
    def to_tma(m: Node) -> Node:
        return stmt(f"tma_load({_slot_text(m.arg('dst'))}, {fmt_view(m.arg('src'))}, bar={_slot_text(m.arg('bar'))})")

    out: list[Node] = []
    for i, n in enumerate(nodes):
        bar = n.arg("bar") if n.op is Op.CP_ASYNC_BAR else loops[i][0] if i in loops else None
        if bar is not None and bar in convert:
            if i == groups[bar][0]:
                total = " + ".join(loops[j][1] if j in loops else _box_bytes(p, nodes[j].arg("dst"))
                                 for j in groups[bar])
                out.append(stmt(f"expect_tx({_slot_text(bar)}, {total})"))
            out.append(replace(n, body=tuple(to_tma(m) for m in n.body)) if i in loops else to_tma(n))
            changed = True
        elif n.op is Op.ARRIVE and n.arg("bar") in convert and arrives.get(n.arg("bar")) == i:
            changed = True
        else:
            out.append(n)
    return tuple(out), changed


def _drop_fences(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    return tuple(replace(n, body=_drop_fences(n.body)) if n.body else n for n in nodes if n.op is not Op.FENCE_ASYNC)


def tma(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Turn the producers' cp.async copies into TMA copies with expect_tx (see the module docstring)."""
    refuse_unless(any(n.op is Op.CP_ASYNC_BAR for n in walk_nodes(p.body)), "no cp_async_bar copies to turn into TMA")
    body, changed = _tma_block(p, p.body)
    refuse_unless(changed, "no cp_async_bar group completes with an arrive in its own block")
    if not any(n.op is Op.CP_ASYNC_BAR for n in walk_nodes(body)):
        body = _drop_fences(body)
    out = replace(p, body=body)
    # a wgmma N that cp.async pinned to one swizzle span (an N-major b) is free under TMA: take a width wgmma takes
    lifted = sorted(wgmma_consts(p)[0] & wgmma_consts(out)[1])
    return out.with_consts(**{k: int(rng.choice(WGMMA_N)) for k in lifted}) if lifted else out


__all__ = ["tma", "Refused"]


# ------------------------------------------------------------------ resident operands

RESIDENT_SLOTS = (1, 2, 4)      # reduction tiles kept resident: RD * BD covers the reduction dimension


def _copies(nodes: tuple[Node, ...]) -> list[Node]:
    return [n for n in walk_nodes(nodes) if n.op in (Op.CP_ASYNC_BAR, Op.TMA_LOAD)]


def _role(p: Program, pred) -> Node | None:
    return next((n for n in p.body if n.op is Op.ROLE and pred(n)), None)


def _loop_nest(role: Node, buf: str) -> tuple[Node, Node, Node]:
    """(outer loop, inner loop, copy into ``buf``) of a producer role."""
    for o in role.body:
        if o.op is not Op.FOR:
            continue
        for r in o.body:
            if r.op is Op.FOR:
                for c in r.body:
                    if c.op in (Op.CP_ASYNC_BAR, Op.TMA_LOAD) and c.arg("dst").buf == buf:
                        return o, r, c
    raise Refused(f"`{buf}` is not copied in a loop nested in the producer's candidate loop")


def _resident_slots(p: Program, extent, rng: np.random.Generator, bounds) -> int:
    """How many reduction tiles to keep: the fewest that cover the largest reduction dimension of the run's
    search shapes (``bounds``), or a choice among RESIDENT_SLOTS without bounds."""
    dims = symbols(extent) - set(p.const_env)
    if not bounds or not dims or any(d not in bounds for d in dims):
        return int(rng.choice(RESIDENT_SLOTS))
    need = try_evaluate(extent, {**p.const_env, **{d: bounds[d] for d in dims}})
    fits = [s for s in RESIDENT_SLOTS if need is not None and s >= need]
    refuse_unless(bool(fits), f"the reduction takes {need} tiles at the run's largest shape; at most "
                              f"{RESIDENT_SLOTS[-1]} stay resident")
    return fits[0]


def resident(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Keep an operand that the candidate loop does not change resident in shared memory.

    Before (a warp-specialized argmin-epilogue contraction: x's tile is copied again for every centroid tile)::

        with role("producer", warps=(0, 4), regs=40):
            for kt in range(cdiv(K, BK)):
                for dt in range(cdiv(D, BD)):
                    it = kt * cdiv(D, BD) + dt
                    wait(empty[it % S], phase=(it // S + 1) % 2)
                    expect_tx(full[it % S], BN * BD * 2 + BK * BD * 2)
                    tma_load(x_s[it % S], x[bid.y, tile(bid.x, BN), tile(dt, BD)], bar=full[it % S])
                    tma_load(c_s[it % S], c[bid.y, tile(kt, BK), tile(dt, BD)], bar=full[it % S])
        with role("consumer", warps=(4, 12), regs=232):
            for kt in range(cdiv(K, BK)):
                for dt in range(cdiv(D, BD)):
                    ...
                    wgmma(dot, x_s[it % S], c_s[it % S], b_major="k")

    After (x's RD tiles copied once, before the loop; the reduction runs RD tiles, those past D
    zero-filled, so RD * BD bounds D: the kernel's domain)::

        x_s = smem(bf16, (BN, BD), stages=2, swizzle=128)
        x_full = mbarrier(1)
        with role("producer", warps=(0, 4), regs=40):
            expect_tx(x_full[0], BN * BD * 2 * RD)
            for dt in range(RD):
                tma_load(x_s[dt], x[bid.y, tile(bid.x, BN), tile(dt, BD)], bar=x_full[0])
            for kt in range(cdiv(K, BK)):
                for dt in range(RD):
                    it = kt * RD + dt
                    ...
                    expect_tx(full[it % S], BK * BD * 2)
                    tma_load(c_s[it % S], c[bid.y, tile(kt, BK), tile(dt, BD)], bar=full[it % S])
        with role("consumer", warps=(4, 12), regs=232):
            wait(x_full[0], phase=0)
            for kt in range(cdiv(K, BK)):
                for dt in range(RD):
                    ...
                    wgmma(dot, x_s[dt], c_s[it % S], b_major="k")

    Precondition: a producer/consumer program whose producer copies an operand in a reduction loop
    nested in a candidate loop, with a window that does not use the candidate loop's variable
    (an argmin epilogue's points, a top-k epilogue's queries).
    """
    prod = _role(p, lambda n: bool(_copies(n.body)))
    cons = _role(p, lambda n: any(m.op is Op.WGMMA for m in walk_nodes(n.body)))
    refuse_unless(prod is not None and cons is not None, "no producer role with copies and wgmma consumer role")
    wg = [m for m in walk_nodes(cons.body) if m.op is Op.WGMMA]
    a_bufs = {m.arg("a").buf for m in wg}
    cand = None
    for buf in sorted(a_bufs):
        try:
            o, r, c = _loop_nest(prod, buf)
        except Refused:
            continue
        if o.arg("var") not in view_syms(c.arg("src")) and r.arg("var") in view_syms(c.arg("src")):
            cand = (buf, o, r, c)
            break
    refuse_unless(cand is not None, "no wgmma a operand whose copy is independent of the candidate loop")
    buf, o, r, c = cand
    refuse_unless(sum(1 for m in _copies(prod.body) if m.arg("dst").buf == buf) == 1,
                  f"`{buf}` is copied at more than one place")
    red_extent = r.arg("extent")
    slots = _resident_slots(p, red_extent, rng, bounds)
    bar = fresh(p, f"{buf.removesuffix('_s')}_full")
    rd = fresh(p, "RD")
    tma_form = c.op is Op.TMA_LOAD
    rv, extent = r.arg("var"), rd
    box = _box_bytes(p, c.arg("dst"))
    if tma_form:
        pre = [f"expect_tx({bar}[0], {box} * {extent})",
               f"for {rv} in range({extent}):",
               f"    tma_load({buf}[{rv}], {fmt_view(c.arg('src'))}, bar={bar}[0])"]
    else:
        pre = [f"for {rv} in range({extent}):",
               f"    cp_async_bar({buf}[{rv}], {fmt_view(c.arg('src'))}, bar={bar}[0])",
               f"arrive({bar}[0])"]
    pre_nodes = stmts("\n".join(pre))

    def new_inner(rn: Node) -> Node:
        body = [m for m in rn.body if m is not c]
        if tma_form:      # the group's expect_tx no longer counts the resident box
            group = [m for m in body if m.op is Op.TMA_LOAD and m.arg("bar") == c.arg("bar")]
            fixed = []
            for m in body:
                if m.op is Op.EXPECT_TX and m.arg("bar") == c.arg("bar"):
                    refuse_unless(group, "the resident copy was the only one of its barrier's group")
                    total = " + ".join(_box_bytes(p, g.arg("dst")) for g in group)
                    m = stmt(f"expect_tx({_slot_text(m.arg('bar'))}, {total})")
                fixed.append(m)
            body = fixed
        return replace(rn, body=tuple(body))

    new_outer = replace(o, body=tuple(new_inner(m) if m is r else m for m in o.body))
    new_prod = replace(prod, body=tuple(pre_nodes) + tuple(new_outer if m is o else m for m in prod.body))

    def fix_cons(nodes: tuple[Node, ...], loopvar: str | None) -> tuple[Node, ...]:
        out = []
        for m in nodes:
            if m.op is Op.FOR:
                m = replace(m, body=fix_cons(m.body, m.arg("var")))
            elif m.body:
                m = replace(m, body=fix_cons(m.body, loopvar))
            elif m.op is Op.WGMMA and m.arg("a").buf == buf:
                m = with_args(m, a=Slot(buf, Sym(loopvar)))
            out.append(m)
        return tuple(out)

    waits = stmts(f"wait({bar}[0], phase=0)" + ("" if tma_form else "\nfence_async()"))
    new_cons = replace(cons, body=tuple(waits) + fix_cons(cons.body, None))

    def top(m: Node) -> tuple[Node, ...]:
        if m.op is Op.SMEM and m.result == buf:
            return (replace(m, attrs=tuple(sorted({**dict(m.attrs), "stages": slots}.items()))),
                    stmt(f"{bar} = mbarrier(1)"))
        if m is prod:
            return (new_prod,)
        if m is cons:
            return (new_cons,)
        return (m,)

    body = tuple(x for m in p.body for x in top(m))
    # the reduction runs RD tiles whatever D is: tiles past the edge are zero-filled and add nothing
    body = tuple(replace_expr(m, red_extent, Sym(rd)) for m in body)
    out = replace(p, body=body).with_consts(**{rd: slots})
    return _batch_producer_reads(out, slots)


def _batch_producer_reads(p: Program, trips: int) -> Program:
    """A producer that reads what it copied (sqnorm_rows of the landed tile) waits for each copy before
    issuing the next. With a static reduction of ``trips`` steps that fit the ring, it issues a candidate
    tile's copies first and then waits and reads; with room for two tiles (S >= 2 * trips) it reads each
    tile one candidate trip later, after issuing the next tile's copies, so copies stay in flight while it
    reads (the candidate loop runs one trip more: ``if kt < E`` copies, ``if kt > 0`` reads tile kt - 1)."""
    ring_size = [0]

    def split(n: Node) -> tuple[Node, ...]:
        if n.op is not Op.FOR or not any(m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) for m in n.body):
            return (replace(n, body=tuple(x for m in n.body for x in split(m))),) if n.body else (n,)
        bars = {m.arg("bar") for m in n.body if m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR)}
        at = next((i for i, m in enumerate(n.body) if m.op is Op.WAIT and m.arg("bar") in bars), None)
        ring = next((m.arg("bar").index.b.name for m in n.body if m.op is Op.WAIT
                     and isinstance(m.arg("bar").index, Bin) and m.arg("bar").index.op == "%"
                     and isinstance(m.arg("bar").index.b, Sym)), None)
        if at is None or ring is None or p.const_env.get(ring, 0) < trips:
            return (n,)
        ring_size[0] = p.const_env[ring]
        lets = tuple(m for m in n.body[:at] if m.op is Op.LET)
        return replace(n, body=n.body[:at]), replace(n, body=lets + n.body[at:])

    def lag(cand: Node) -> Node:
        """The candidate loop with its reads (and their publication) one trip behind its copies."""
        var, stop = cand.arg("var"), loop_range(cand)[1]
        copies = [i for i, m in enumerate(cand.body) if m.op is Op.FOR and _copies(m.body)]
        reads = [i for i, m in enumerate(cand.body) if m.op is Op.FOR and not _copies(m.body)
                 and any(k.op is Op.SQNORM_ROWS for k in walk_nodes(m.body))]
        if len(copies) != 1 or len(reads) != 1 or ring_size[0] < 2 * trips or loop_range(cand)[0] != 0:
            return cand
        c, r = copies[0], reads[0]
        head = [m for m in cand.body[:c] if m.op is Op.WAIT]     # the wait for the read's output slot
        tail = [m for m in cand.body[r + 1:] if m.op is Op.ARRIVE]
        if len(head) + len(tail) + 2 != len(cand.body):
            return cand
        back = {var: Bin("-", Sym(var), 1)}
        late = tuple(map_exprs(m, lambda e: subst_expr(e, back)) for m in head + [cand.body[r]] + tail)
        body = (replace(stmt(f"if {var} < {fmt_expr(stop)}:\n    pass"), body=(cand.body[c],)),
                replace(stmt(f"if {var} > 0:\n    pass"), body=late))
        return replace(with_args(cand, extent=Bin("+", stop, 1)), body=body)

    def fix_role(r: Node) -> Node:
        body = tuple(x for m in r.body for x in split(m))
        return replace(r, body=tuple(lag(m) if m.op is Op.FOR and any(
            k.op is Op.FOR and _copies(k.body) for k in m.body) else m for m in body))

    roles = tuple(fix_role(r) if r.op is Op.ROLE and _copies(r.body) else r for r in p.body)
    return replace(p, body=roles)
