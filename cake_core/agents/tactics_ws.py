"""Warp specialization: a CTA-collective mainloop becomes a producer role and a wgmma consumer role.

``warp_specialize`` is the step from a kernel in which every thread loads, waits at ``sync()`` and
multiplies to one in which a producer warpgroup copies operand tiles into an S-stage ring of swizzled
shared memory (``cp_async_bar``, full/empty mbarriers) while consumer warpgroups multiply with the
asynchronous ``wgmma`` atom and run the epilogue on the accumulator's fragment. It changes the MMA atom
(any -> wgmma), the copy engine (plain loads -> a multi-stage cp.async ring), the warp roles (one ->
producer/consumer with a setmaxnreg split) and the epilogue (scores + running merge -> the fused
``argmin_bias`` / ``topk_bias``), because each needs the others: wgmma runs in roles of whole warpgroups,
roles talk through mbarriers, and inside a role only a wgmma accumulator's fragment epilogue is lowered.

Tile shapes are set to what wgmma takes: the reduction tile to one 128-byte swizzle span (64 16-bit
elements), the accumulator's rows to 64 per consumer warpgroup (two from 128 rows up, else one or two) and
its columns to a multiple of 64 up to 256.

Before (a top-k epilogue's seed, abridged)::

    q_s = smem(bf16, (BQ, BD))
    ...
    for nt in range(cdiv(N, BN)):
        fill(dot)
        fill(norm)
        for dt in range(cdiv(D, BD)):
            load(q_s, q[tile(bid.x, BQ), tile(dt, BD)])
            load(db_s, db[tile(nt, BN), tile(dt, BD)])
            sync()
            transpose(dbt_s, db_s)
            unary(sq, db_s, fn="square")
            sync()
            mma(dot, q_s, dbt_s)
            reduce(part, sq, axis=1)
            ewise(norm, norm, part)
            sync()
        ewise(scores, norm, dot, beta=2.0, fn="sub")
        topk_merge(top_v, top_i, scores, base=nt * BN, limit=N)
    store(idx[tile(bid.x, BQ), tile(0, KMAX)], top_i)

After (threads=384, BD=64, BQ=128, S=3; the row norms move to the producer, which computes them from the
landed tile)::

    q_s = smem(bf16, (BQ, BD), stages=3, swizzle=128)
    db_s = smem(bf16, (BN, BD), stages=3, swizzle=128)
    nrm_s = smem(f32, (BN,), stages=2)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    efull = mbarrier(2)
    eempty = mbarrier(2, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        for nt in range(cdiv(N, BN)):
            wait(eempty[nt % 2], phase=(nt // 2 + 1) % 2)
            for dt in range(cdiv(D, BD)):
                it = nt * cdiv(D, BD) + dt
                wait(empty[it % S], phase=(it // S + 1) % 2)
                cp_async_bar(q_s[it % S], q[tile(bid.x, BQ), tile(dt, BD)], bar=full[it % S])
                cp_async_bar(db_s[it % S], db[tile(nt, BN), tile(dt, BD)], bar=full[it % S])
                arrive(full[it % S])
                wait(full[it % S], phase=it // S % 2)
                if dt == 0:
                    sqnorm_rows(nrm_s[nt % 2], db_s[it % S])
                if dt > 0:
                    sqnorm_rows(nrm_s[nt % 2], db_s[it % S], accumulate=True)
            arrive(efull[nt % 2])
    with role("consumer", warps=(4, 12), regs=232):
        dot = rmem(f32, (BQ, BN))
        top_v = rmem(f32, (BQ, KMAX), fill=inf)
        top_i = rmem(i32, (BQ, KMAX), fill=-1.0)
        for nt in range(cdiv(N, BN)):
            for dt in range(cdiv(D, BD)):
                it = nt * cdiv(D, BD) + dt
                wait(full[it % S], phase=it // S % 2)
                fence_async()
                if dt == 0:
                    wgmma(dot, q_s[it % S], db_s[it % S], accumulate=False, b_major="k")
                if dt > 0:
                    wgmma(dot, q_s[it % S], db_s[it % S], b_major="k")
                wgmma_wait(0)
                arrive(empty[it % S])
            wait(efull[nt % 2], phase=nt // 2 % 2)
            topk_bias(top_v, top_i, dot, nrm_s[nt % 2], base=nt * BN, limit=N)
            arrive(eempty[nt % 2])
        store(idx[tile(bid.x, BQ), tile(0, KMAX)], top_i)

An argmin-epilogue contraction's seed takes the same steps, its running arg-min becoming the fused
``argmin_bias``.

Precondition (``find_mainloop``): a CTA-collective contraction mainloop; 16-bit operands whose tile
shapes are program constants. It applies to every seed that multiplies tiles (a GEMM, an argmin or a
top-k epilogue contraction).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.chained import find_chained, warp_specialize_chained
from cake_core.agents.mainloop import Mainloop, find_mainloop
from cake_core.agents.rewrite import Refused, const_of, expr_text, namer, refuse_unless, stmts, walk_nodes
from cake_core.ir.expr import Sym, fmt_expr, symbols
from cake_core.ir.ops import Node, Op, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view

PRODUCER_REGS, CONSUMER_REGS = 40, 232
SPAN_BYTES = 128          # one swizzle-128 row: the K extent of a wgmma operand slot
WGMMA_N = (64, 128, 192, 256)
EPI = 2                   # slots of the epilogue operands' ring: the producer fills a candidate tile's vector
                          # while the consumers still read the last one


def wgmma_consts(p: Program) -> tuple[set[str], set[str]]:
    """(constants fixed by wgmma: accumulator rows and the reduction span; constants that are wgmma's N)."""
    fixed, n_dims = set(), set()
    allocs = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    cp_async = {n.arg("dst").buf for n in walk_nodes(p.body) if n.op is Op.CP_ASYNC_BAR}
    for n in walk_nodes(p.body):
        if n.op is not Op.WGMMA:
            continue
        acc, a = allocs.get(n.arg("acc")), allocs.get(n.arg("a").buf)
        if acc is not None:
            r, c = acc.arg("shape")[0], acc.arg("shape")[1]
            fixed |= symbols(r)
            if isinstance(c, Sym):
                # an N-major b that cp.async fills has rows of one swizzle span: its N stays
                (fixed if n.attr("b_major") == "n" and n.arg("b").buf in cp_async else n_dims).add(c.name)
        if a is not None:
            fixed |= symbols(a.arg("shape")[0]) | symbols(a.arg("shape")[1])
    return fixed, n_dims - fixed


def _consts(p: Program, m: Mainloop, rng: np.random.Generator) -> tuple[dict[str, int], int, str, str, str]:
    """The tile constants wgmma needs: {name: value}, the consumer warpgroups, and the names of the row,
    reduction and column tile constants."""
    ta, tb = m.a.type, m.b.type
    refuse_unless(len(ta.shape) == 2 and len(tb.shape) == 2, "the mma operands are not 2-D tiles")
    rows, red = const_of(p, ta.shape[0]), const_of(p, ta.shape[1])
    cols = const_of(p, tb.shape[1] if m.b_major == "n" else tb.shape[0])
    red_b = const_of(p, tb.shape[0] if m.b_major == "n" else tb.shape[1])
    refuse_unless(None not in (rows, red, cols) and red_b == red,
                  "the operand tiles' shapes are not program constants (rows, reduction, columns)")
    refuse_unless(len({rows, red, cols}) == 3, "the rows, reduction and column tiles share a constant")
    env = p.const_env
    red_elems = SPAN_BYTES // ta.dtype.bytes
    wg = 2 if env[rows] >= 128 else int(rng.choice((1, 2)))
    # an N-major b that cp.async fills has rows of one swizzle span (64 16-bit columns); TMA lifts that
    n = red_elems if m.b_major == "n" else min((c for c in WGMMA_N if c >= env[cols]), default=WGMMA_N[-1])
    return {rows: 64 * wg, red: red_elems, cols: n}, wg, rows, red, cols


def warp_specialize(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split a CTA-collective contraction into a cp.async producer role and a wgmma consumer role; a chained-GEMM
    mainloop (attention-like, ``agents.chained``) into a TMA producer and consumers that chain two wgmmas."""
    try:
        m = find_mainloop(p)
    except Refused as one:
        try:
            chained = find_chained(p)
        except Refused as two:
            raise Refused(f"{one.reason}; as a chained mainloop: {two.reason}") from None
        return warp_specialize_chained(p, chained, rng)
    consts, wg, rows, red, cols = _consts(p, m, rng)
    stages = int(rng.choice((2, 3, 4)))
    r_start, r_stop, r_step = loop_range(m.red)
    refuse_unless(r_start == 0 and r_step == 1, "the reduction loop does not count from 0 in steps of 1")
    if m.outer is not None:
        o_start, _, o_step = loop_range(m.outer)
        refuse_unless(o_start == 0 and o_step == 1, "the candidate loop does not count from 0 in steps of 1")
    name = namer(p)

    S, full, empty = name("S"), name("full"), name("empty")
    it = name("it")
    r = m.red.arg("var")
    red_extent = expr_text(r_stop)
    itx = f"{m.outer.arg('var')} * {red_extent} + {r}" if m.outer is not None else r
    a, b = m.a.buf, m.b.buf
    a_shape, b_shape = (rows, red), ((red, cols) if m.b_major == "n" else (cols, red))
    dt = m.a.type.dtype.value
    epi_bufs = [buf for buf, _ in m.epilogue_loads]
    nrm = name("nrm_s") if m.norm is not None else None
    has_epi = m.epilogue is not None
    efull, eempty = (name("efull"), name("eempty")) if has_epi else (None, None)

    alloc = [f"{a} = smem({dt}, ({a_shape[0]}, {a_shape[1]}), stages={stages}, swizzle=128)",
             f"{b} = smem({dt}, ({b_shape[0]}, {b_shape[1]}), stages={stages}, swizzle=128)"]
    for n in m.head:
        if n.op is Op.SMEM and n.result in epi_bufs:
            alloc.append(f"{n.result} = smem({n.arg('dtype').value}, ({fmt_expr(n.arg('shape')[0])},), stages={EPI})")
    if nrm:
        alloc.append(f"{nrm} = smem(f32, ({cols},), stages={EPI})")
    alloc += [f"{full} = mbarrier({S})", f"{empty} = mbarrier({S}, arrivals={wg})"]
    if has_epi:
        alloc += [f"{efull} = mbarrier({EPI})", f"{eempty} = mbarrier({EPI}, arrivals={wg})"]
    lets = [n for n in m.head if n.op is Op.LET]

    # ---- producer
    step = [f"{it} = {itx}",
            f"wait({empty}[{it} % {S}], phase=({it} // {S} + 1) % 2)",
            f"cp_async_bar({a}[{it} % {S}], {fmt_view(m.a.view)}, bar={full}[{it} % {S}])",
            f"cp_async_bar({b}[{it} % {S}], {fmt_view(m.b.view)}, bar={full}[{it} % {S}])",
            f"arrive({full}[{it} % {S}])"]
    if nrm:
        o = m.outer.arg("var")
        es = f"{nrm}[{o} % {EPI}]"
        step += [f"wait({full}[{it} % {S}], phase={it} // {S} % 2)",
                 f"if {r} == 0:", f"    sqnorm_rows({es}, {b}[{it} % {S}])",
                 f"if {r} > 0:", f"    sqnorm_rows({es}, {b}[{it} % {S}], accumulate=True)"]
    red_loop = [f"for {r} in range({red_extent}):"] + ["    " + s for s in step]
    if m.outer is not None:
        o = m.outer.arg("var")
        trip = []
        if has_epi:
            trip.append(f"wait({eempty}[{o} % {EPI}], phase=({o} // {EPI} + 1) % 2)")
            trip += [f"cp_async_bar({buf}[{o} % {EPI}], {fmt_view(v)}, bar={efull}[{o} % {EPI}])"
                     for buf, v in m.epilogue_loads]
        trip += red_loop
        if has_epi:
            trip.append(f"arrive({efull}[{o} % {EPI}])")
        producer = [f"for {o} in range({expr_text(loop_range(m.outer)[1])}):"] + ["    " + s for s in trip]
    else:
        producer = red_loop

    # ---- consumer: each step waits for its wgmma and releases its slot, whatever the reduction's extent
    # (holding a tile's slots until its last wgmma would deadlock once the extent passes S)
    mma_b_major = f', b_major="k"' if m.b_major == "k" else ""
    wg_call = f"wgmma({m.acc}, {a}[{it} % {S}], {b}[{it} % {S}]{mma_b_major}"
    body = [f"{it} = {itx}", f"wait({full}[{it} % {S}], phase={it} // {S} % 2)", "fence_async()"]
    if m.outer is not None:
        body += [f"if {r} == 0:", f"    {wg_call}, accumulate=False)", f"if {r} > 0:", f"    {wg_call})"]
    else:
        body += [f"{wg_call})"]
    body += ["wgmma_wait(0)", f"arrive({empty}[{it} % {S}])"]
    c_red = [f"for {r} in range({red_extent}):"] + ["    " + s for s in body]
    rmem = [n for n in m.head if n.op is Op.RMEM and n.result not in m.dropped and n.result != m.norm]
    if m.outer is not None:
        o = m.outer.arg("var")
        e = m.epilogue
        trip = list(c_red)
        if e is not None:
            bias = nrm if e.bias == m.norm else e.bias
            op = "argmin_bias" if e.kind == "argmin" else "topk_bias"
            trip += [f"wait({efull}[{o} % {EPI}], phase={o} // {EPI} % 2)",
                     f"{op}({e.state[0]}, {e.state[1]}, {m.acc}, {bias}[{o} % {EPI}], base={expr_text(e.base)}, "
                     f"limit={expr_text(e.limit)}, beta={e.beta!r})",
                     f"arrive({eempty}[{o} % {EPI}])"]
        consumer_loops = [f"for {o} in range({expr_text(loop_range(m.outer)[1])}):"] + ["    " + s for s in trip]
    else:
        consumer_loops = c_red
    threads = 128 + 128 * wg
    prod = stmts("\n".join([f'with role("producer", warps=(0, 4), regs={PRODUCER_REGS}):']
                           + ["    " + s for s in producer]))
    cons_head = stmts("\n".join([f'with role("consumer", warps=(4, {4 + 4 * wg}), regs={CONSUMER_REGS}):']
                                + ["    " + s for s in consumer_loops]))[0]
    cons = replace(cons_head, body=tuple(rmem) + cons_head.body + m.tail)
    body_nodes = tuple(lets) + stmts("\n".join(alloc)) + prod + (cons,)
    # setmaxnreg roles own their SM: a co-residency the role-free parent asked for (occupancy) is dropped
    out = replace(p, threads=threads, body=body_nodes, ctas_per_sm=0).with_consts(**consts, **{S: stages})
    return out


__all__ = ["warp_specialize", "Refused"]
