"""Built-in verifier rules, grouped by family. Each: a stable id, a message, a hint.

Families: types (names, memory spaces, dtypes), shapes (extents, static
shapes, symbols), mma, resources (smem, threads, registers), races (shared
memory accessed across a missing barrier), target.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, LAUNCH_SYMBOLS, fmt_expr, symbols, try_evaluate
from cake_core.ir.opdef import Alloc, Family, Operand, Ordering, Scope, SyncKind, buffer_name
from cake_core.ir.fragments import epilogue_state
from cake_core.ir.ops import REGISTRY, Node, Op, Tile, View, loop_range
from cake_core.ir.printer import fmt_view
from cake_core.ir.passes import node_exprs
from cake_core.ir.scratch import staged_operands
from cake_core.ir.smem_access import conflict, owned_accesses, smem_accesses
from cake_core.ir.smem_layout import SCRATCH
from cake_core.ir.rule_ctx import (Ctx, RuleSet, fmt_shape, layouts, rmem_words_per_thread, same_extent, smem,
                                   smem_bytes, view_extent)
from cake_core.ir.types import DType, MemSpace
from cake_core.outcome import Diagnostic, Severity

RULESET = RuleSet()
rule = RULESET.rule

# the CTA-wide copies: a tile and a gmem window of the same extent, one of them read, the other written
_COPIES = (Op.LOAD, Op.STORE)
_MMA = (Op.MMA,)
_ALLOCS = frozenset(op for op, d in REGISTRY.items() if d.allocates in (Alloc.SMEM, Alloc.RMEM))


def _operands(n: Node) -> Iterator[tuple[Operand, object]]:
    return zip(REGISTRY[n.op].operands, n.args)


def _tile_operand(n: Node) -> str:
    """The tile a CTA-wide copy reads or writes (its one buf operand)."""
    return next(a for o, a in _operands(n) if o.kind == "buf")


def _view_operand(n: Node) -> View:
    return next(a for o, a in _operands(n) if o.kind == "view")


# ------------------------------------------------------------------- types

@rule("types.redefined", "types", "a result name is bound twice or shadows a parameter",
      guards=_ALLOCS | {Op.MBARRIER} | {op for op, d in REGISTRY.items() if any(o.binds is Scope.BODY
                                                                                  for o in d.operands)})
def _redefined(ctx: Ctx) -> Iterable[Diagnostic]:
    seen = {p.name: None for p in ctx.program.params}
    for n, path, scope in ctx.nodes:
        names = [n.result] if n.result else n.decl.bound_names(n, Scope.BODY)
        for name in names:
            if name in seen or name in scope or name in ctx.consts or name in ctx.dims:
                first = seen.get(name)
                yield ctx.diag("types.redefined", n, f"`{name}` is already defined", path=path,
                               witness=[f"first defined at line {first.line}"] if first is not None else [],
                               hint="buffers are allocated once; give this one a new name")
            if n.result:        # loop variables are scoped to their loop (sibling roles may both use `kt`)
                seen[name] = n


@rule("types.view_rank", "types", "a view indexes a tensor with the wrong number of dimensions", guards=_COPIES)
def _view_rank(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op in _COPIES:
            v = _view_operand(n)
            t = ctx.buffers.get(v.buf)
            if t is not None and len(v.index) != t.rank:
                yield ctx.diag("types.view_rank", n, f"`{v.buf}` has {t.rank} dimensions, the view gives "
                                                     f"{len(v.index)}", path=path,
                               hint="give one index per dimension: tile(i, n), `:` or an index")


@rule("types.dtype", "types", "a copy or an accumulator has the wrong dtype", guards=(Op.LOAD, Op.MMA))
def _dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is Op.LOAD:
            d, s = ctx.buf_of(n.arg("dst")), ctx.buf_of(n.arg("src"))
            if d and s and d.dtype != s.dtype:
                yield ctx.diag("types.dtype", n, f"load copies {s.dtype.value} into a {d.dtype.value} tile",
                               path=path, hint=f"allocate the destination as {s.dtype.value}")
        if n.op is Op.MMA:
            acc = ctx.buf_of(n.arg("acc"))
            if acc and acc.dtype is not DType.F32:
                yield ctx.diag("types.dtype", n, f"the accumulator is {acc.dtype.value}; mma accumulates in f32",
                               path=path, hint="allocate it as rmem(f32, ...)")


# ------------------------------------------------------------------ shapes

@rule("shapes.extent", "shapes", "the tile and the gmem window of a load/store differ in shape", guards=_COPIES)
def _extent(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op not in _COPIES:
            continue
        v = _view_operand(n)
        t = ctx.buf_of(_tile_operand(n))
        ext = view_extent(ctx, v)
        if t is None or ext is None:
            continue
        if not same_extent(ctx, t.shape, ext):
            yield ctx.diag("shapes.extent", n, f"tile shape {fmt_shape(ctx, t.shape)} does not match the window "
                                               f"{fmt_shape(ctx, ext)} of `{v.buf}`", path=path,
                           hint="make the tile() sizes equal the tile's shape")


@rule("shapes.static", "shapes", "an smem/rmem tile has a shape that is not known at compile time", guards=_ALLOCS)
def _static(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op in _ALLOCS:
            for d in n.args[1]:
                v = ctx.static(d)
                if v is None or v < 1:
                    yield ctx.diag("shapes.static", n, f"dimension `{d}` of `{n.result}` is not a positive "
                                                       "compile-time constant", path=path,
                                   hint="use integers or names from consts={...}")
                    break


@rule("shapes.symbols", "shapes", "an index expression (an `if` condition included) uses a name that is not defined",
      guards=(op for op, d in REGISTRY.items() if any(o.kind in ("expr", "shape", "view", "cond") for o in d.operands)))
def _symbols(ctx: Ctx) -> Iterable[Diagnostic]:
    # launch symbols out of place (num_sms in the body, ncta in the grid) are shapes.launch_symbols' to report
    base = set(ctx.consts) | ctx.dims | set(CTA_COORDS) | set(CTA_COUNTS) | set(LAUNCH_SYMBOLS)
    grid_syms = set().union(*(symbols(g) for g in ctx.program.grid)) if ctx.program.grid else set()
    for s in sorted(grid_syms - base):
        yield ctx.diag("shapes.symbols", None, f"the grid uses `{s}`, which is neither a const nor a "
                                               "problem dimension", hint="grid extents may use consts and dims")
    # bindings out of their scope: let.scope reports them
    bound = {v for n, _, _ in ctx.nodes for v in n.decl.bound_names(n, Scope.BLOCK)}
    for n, path, scope in ctx.nodes:
        exprs = node_exprs(n, slots=False) + [a for o, a in _operands(n) if o.kind == "cond"]   # `if` conditions
        bad = set().union(*(symbols(e) for e in exprs)) - base - scope - bound if exprs else set()
        for s in sorted(bad):
            yield ctx.diag("shapes.symbols", n, f"`{s}` is not defined", path=path,
                           hint="index expressions may use consts, problem dims, loop variables, bindings "
                                "(`name = expr` above) and bid.x/y/z")


@rule("shapes.launch_symbols", "shapes", "num_sms appears in the grid only; ncta.x/y/z in the body only",
      guards=(op for op, d in REGISTRY.items() if any(o.kind in ("expr", "shape", "view", "slot") for o in d.operands)))
def _launch_symbols(ctx: Ctx) -> Iterable[Diagnostic]:
    for g in ctx.program.grid:
        for s in sorted(symbols(g) & set(CTA_COUNTS)):
            yield ctx.diag("shapes.launch_symbols", None, f"the grid uses `{s}`, the grid's own CTA count",
                           path="kernel.grid", hint="size a persistent grid as min(tiles, num_sms)")
    for n, path, _ in ctx.nodes:
        used = set().union(*(symbols(e) for e in node_exprs(n)))
        for s in sorted(used & set(LAUNCH_SYMBOLS)):
            yield ctx.diag("shapes.launch_symbols", n, f"`{s}` is a launch symbol of the grid only; the kernel "
                                                       "body does not see it", path=path,
                           hint="step a persistent tile loop by the CTA count: range(bid.x, tiles, ncta.x)")


@rule("control.loop_step", "control", "a for loop's step must be positive", guards=(Op.FOR,))
def _loop_step(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.FOR:
            continue
        step = ctx.static(loop_range(n)[2])
        if step is not None and step < 1:
            yield ctx.diag("control.loop_step", n, f"loop `{n.args[0]}` steps by {step}: the loop would never "
                                                   "end or never run", path=path,
                           hint="step by a positive amount, e.g. range(bid.x, tiles, ncta.x)")


@rule("shapes.tail_guard", "shapes", "an unguarded load/store tiles a dimension the tile may not divide",
      Severity.WARNING, guards=_COPIES)
def _tail_guard(ctx: Ctx) -> Iterable[Diagnostic]:
    """A warning, not an error: a kernel specialised for tile multiples is legitimate, and
    the shape set decides. With the run's shapes known, the witness is a shape that breaks."""
    for n, path, _ in ctx.nodes:
        if n.op not in _COPIES or n.attr("guard"):
            continue
        v = _view_operand(n)
        t = ctx.buffers.get(v.buf)
        if t is None or len(v.index) != t.rank:
            continue
        for i, dim in zip(v.index, t.shape):
            size = ctx.static(i.size) if isinstance(i, Tile) else None
            if size is None or size == 1 or ctx.static(dim) is not None:
                continue
            dname = fmt_expr(dim)
            bad = next((s for s in ctx.shapes if (v_ := try_evaluate(dim, s)) is not None and v_ % size), None)
            witness = ([f"shape {', '.join(f'{k}={x}' for k, x in bad.items())}: {dname} = "
                        f"{try_evaluate(dim, bad)} is not a multiple of {size}; the last tile reaches past the "
                        "edge"] if bad else [])
            if ctx.shapes and bad is None:
                continue     # every shape of the run is a multiple: the specialisation is sound here
            yield ctx.diag("shapes.tail_guard", n,
                           f"unguarded {n.op.value} of `{v.buf}` along `{dname}` in tiles of {size}: "
                           f"wrong or out of bounds unless {dname} is a multiple of {size}",
                           path=path, witness=witness, hint="drop guard=False, or run only on tile multiples")
            break


_VIEW_OPS = frozenset(op for op, d in REGISTRY.items() if any(o.kind == "view" for o in d.operands))
_TMA_COPIES = (Op.TMA_LOAD, Op.TMA_STORE)


@rule("shapes.offset_window", "shapes", "a window at an offset (base=, limit=) where the op cannot honour it",
      guards=_VIEW_OPS)
def _offset_window(ctx: Ctx) -> Iterable[Diagnostic]:
    """A TMA box starts at a multiple of its size and stops at the tensor's edge only; an unguarded copy reads
    and writes past any limit (``guard=False`` drops the very check a limit is made of)."""
    for n, path, _ in ctx.nodes:
        for o, v in _operands(n):
            if o.kind != "view" or not isinstance(v, View):
                continue
            off = next((i for i in v.index if isinstance(i, Tile) and i.offset), None)
            if off is None:
                continue
            if n.op in _TMA_COPIES:
                yield ctx.diag("shapes.offset_window", n, f"{n.op.value} of {fmt_view(v)}: a TMA box cannot start at "
                                                          "base= or stop at limit=", path=path,
                               hint="copy the window with load() or cp_async(), or tile it as tile(i, n)")
            elif off.limit is not None and "guard" in REGISTRY[n.op].attrs and not n.attr("guard"):
                yield ctx.diag("shapes.offset_window", n, f"unguarded {n.op.value} of {fmt_view(v)}: limit= is "
                                                          "enforced by the guard that guard=False drops", path=path,
                               hint="drop guard=False")


# ---------------------------------------------------------------------- mma

@rule("mma.shape", "mma", "mma operand shapes do not chain: acc (M,N) += a (M,K) @ b (K,N)", guards=_MMA)
def _mma_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.MMA:
            continue
        acc, a, b = (ctx.buf_of(n.arg(x)) for x in ("acc", "a", "b"))
        if not (acc and a and b):
            continue
        if acc.rank != 2 or a.rank != 2 or b.rank != 2:
            yield ctx.diag("mma.shape", n, "mma operands must be 2-D tiles", path=path)
            continue
        ok = (same_extent(ctx, acc.shape[:1], a.shape[:1]) and same_extent(ctx, acc.shape[1:], b.shape[1:])
              and same_extent(ctx, a.shape[1:], b.shape[:1]))
        if not ok:
            yield ctx.diag("mma.shape", n, f"acc {fmt_shape(ctx, acc.shape)} += a {fmt_shape(ctx, a.shape)} @ "
                                           f"b {fmt_shape(ctx, b.shape)} does not chain", path=path,
                           hint="acc must be (M, N), a (M, K) and b (K, N)")


@rule("mma.operand_dtype", "mma", "mma operands must share a dtype: bf16 or f16, or f32 with atom=fma or atom=mma_sync "
                                  "(three tf32 products a step: fp32's accuracy)", guards=_MMA)
def _mma_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.MMA:
            continue
        a, b = ctx.buf_of(n.arg("a")), ctx.buf_of(n.arg("b"))
        if not (a and b):
            continue
        ok_types = (DType.BF16, DType.F16) + ((DType.F32,) if n.attr("atom") in ("fma", "mma_sync") else ())
        if a.dtype != b.dtype or a.dtype not in ok_types:
            yield ctx.diag("mma.operand_dtype", n, f"mma with a: {a.dtype.value}, b: {b.dtype.value} under "
                                                   f"atom={n.attr('atom')}", path=path,
                           hint="use bf16 or f16 for both operands, or f32 for both (atom fma or mma_sync)")


@rule("mma.atom_target", "mma", "the MMA atom does not exist on the target", guards=_MMA)
def _mma_atom(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is Op.MMA and n.attr("atom") not in ctx.target.mma_atoms:
            yield ctx.diag("mma.atom_target", n, f"atom `{n.attr('atom')}` is not available on "
                                                 f"{ctx.target.arch}", path=path,
                           hint=f"atoms on {ctx.target.arch}: {', '.join(ctx.target.mma_atoms)}")


@rule("mma.sync_tiling", "mma", "an mma_sync accumulator must tile into m16n8k16 atoms (m16n8k8 for f32 operands) "
                                "over the CTA's warps",
      guards=_MMA)
def _mma_sync_tiling(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.MMA or n.attr("atom") != "mma_sync":
            continue
        acc, a = ctx.buf_of(n.arg("acc")), ctx.buf_of(n.arg("a"))
        if not (acc and a) or acc.rank != 2 or a.rank != 2:
            continue
        m, nn, k = ctx.static(acc.shape[0]), ctx.static(acc.shape[1]), ctx.static(a.shape[1])
        if None in (m, nn, k):
            continue
        warps = ctx.program.threads // ctx.target.warp_size
        atom = ctx.target.mma_sync
        step = atom.k_32bit if a.dtype is DType.F32 else atom.k_16bit
        grids = [(wm, warps // wm) for wm in range(1, warps + 1) if warps % wm == 0]
        if k % step or not any(m % (atom.m * wm) == 0 and nn % (atom.n * wn) == 0 for wm, wn in grids):
            yield ctx.diag("mma.sync_tiling", n, f"acc ({m}, {nn}) with K = {k} cannot be tiled by {warps} warps in "
                                                 f"m{atom.m}n{atom.n}k{step} atoms", path=path,
                           hint=f"K must be a multiple of {step}, and M, N multiples of {atom.m}·WM and "
                                f"{atom.n}·WN for a warp grid WM × WN = {warps} (e.g. M a multiple of "
                                f"{atom.m * warps})")


# ---------------------------------------------------------------- resources

@rule("resources.smem", "resources", "shared memory per CTA, as the lowering lays it out (tiles, mbarriers, "
                                    "alignment gaps, scratch), exceeds the target's limit",
      guards={op for op, d in REGISTRY.items() if d.allocates in (Alloc.SMEM, Alloc.MBARRIER)})
def _smem(ctx: Ctx) -> Iterable[Diagnostic]:
    """The layout is ``ir.smem_layout``'s, the one the lowering emits; the statement reported is the first whose
    memory ends past the limit (a scratch region past it is compute.scratch_smem's)."""
    lay, limit = smem(ctx), ctx.target.smem_per_cta_bytes
    first = lay.first_past(limit)
    if lay.total is None or lay.total <= limit or first is None or first.kind == SCRATCH:
        return
    what = f"`{first.name}` ({first.nbytes} B at offset {first.offset})"
    yield ctx.diag("resources.smem", first.node, f"the CTA needs {lay.total} B of shared memory; "
                                                 f"{ctx.target.arch} allows {limit} B: {what} ends past the limit",
                   path=_path_of(ctx, first.node), witness=[lay.breakdown()],
                   hint="shrink the tiles or the number of stages (a swizzle-128 tile starts on a "
                        f"{ctx.target.tma.swizzle_smem_align_bytes} B boundary; allocate those first to save the gap)")


def _path_of(ctx: Ctx, n: Node) -> str:
    return next((p for m, p, _ in ctx.nodes if m is n), "kernel")


@rule("resources.threads", "resources", "threads per CTA must be a multiple of 32 and within the target")
def _threads(ctx: Ctx) -> Iterable[Diagnostic]:
    t, mx, warp = ctx.program.threads, ctx.target.max_threads_per_cta, ctx.target.warp_size
    if t < warp or t > mx or t % warp:
        yield ctx.diag("resources.threads", None, f"threads={t}: must be a multiple of {warp} between {warp} and "
                                                  f"{mx}",
                       path="kernel", hint="use 128, 256 or 384 threads (whole warpgroups on Hopper)")


@rule("resources.ctas_per_sm", "resources", "ctas_per_sm CTAs must fit on one SM together: threads, shared "
                                          "memory, registers; setmaxnreg roles need the SM to themselves")
def _ctas_per_sm(ctx: Ctx) -> Iterable[Diagnostic]:
    n = ctx.program.ctas_per_sm
    if not n or ctx.program.threads < 1:
        return          # no threads: resources.threads reports the CTA itself
    t = ctx.target
    if n * ctx.program.threads > t.max_threads_per_sm:
        yield ctx.diag("resources.ctas_per_sm", None, f"ctas_per_sm={n} CTAs of {ctx.program.threads} threads need "
                                                      f"{n * ctx.program.threads} threads; an SM holds "
                                                      f"{t.max_threads_per_sm}", path="kernel",
                       hint=f"at most {t.max_threads_per_sm // ctx.program.threads} CTAs of this size")
    total = smem_bytes(ctx)
    if total is not None and n * total > t.smem_per_sm_bytes:
        yield ctx.diag("resources.ctas_per_sm", None, f"ctas_per_sm={n} CTAs of {total} B of shared memory need "
                                                      f"{n * total} B; an SM has {t.smem_per_sm_bytes} B",
                       path="kernel", hint="fewer CTAs per SM, or smaller tiles or fewer stages")
    if n > 1 and any(m.op is Op.ROLE and m.attr("regs") for m, _, _ in ctx.nodes):
        yield ctx.diag("resources.ctas_per_sm", None, f"ctas_per_sm={n} with setmaxnreg roles: setmaxnreg moves "
                                                      "registers between the warps of one CTA that owns the SM",
                       path="kernel", hint="drop ctas_per_sm (one CTA per SM) or the roles' regs=")
    cap = min(t.max_regs_per_thread, t.regs_per_sm // (n * ctx.program.threads) // t.setmaxnreg.step * t.setmaxnreg.step)
    words = rmem_words_per_thread(ctx)
    if words is not None and words > cap:
        yield ctx.diag("resources.ctas_per_sm", None, f"rmem tiles need {words} registers per thread; "
                                                      f"ctas_per_sm={n} leaves {cap}", path="kernel",
                       hint="fewer CTAs per SM, or smaller register tiles")


@rule("resources.registers", "resources", "register tiles need more registers per thread than exist",
      guards=(op for op, d in REGISTRY.items() if d.allocates is Alloc.RMEM))
def _regs(ctx: Ctx) -> Iterable[Diagnostic]:
    words = rmem_words_per_thread(ctx)
    limit = ctx.target.max_regs_per_thread
    if words is not None and words > limit:
        yield ctx.diag("resources.registers", None, f"rmem tiles need {words} registers per thread; the limit "
                                                    f"is {limit}", path="kernel",
                       hint="use more threads or smaller register tiles")


@rule("resources.rmem_split", "resources", "an rmem tile must split evenly over the CTA's threads",
      guards=(op for op, d in REGISTRY.items() if d.allocates is Alloc.RMEM))
def _rmem_split(ctx: Ctx) -> Iterable[Diagnostic]:
    # a fused epilogue's row state (the rmem tiles it reads and writes, argmin_bias best/arg, topk_bias
    # top_v/top_i) and a role's fragments and row vectors (ir.fragments) are held per fragment row, not split
    # over the threads
    rowstate = epilogue_state(ctx.program) | set(layouts(ctx))
    for n, path, _ in ctx.nodes:
        numel = ctx.static_numel(n.args[1]) if REGISTRY[n.op].allocates is Alloc.RMEM and n.result not in rowstate \
            else None
        if numel is not None and ctx.threads_of(n) > 0 and numel % ctx.threads_of(n):
            yield ctx.diag("resources.rmem_split", n, f"`{n.result}` has {numel} elements, not a multiple "
                                                      f"of threads={ctx.threads_of(n)}", path=path,
                           hint="pick tile sizes whose product is a multiple of the thread count")


# -------------------------------------------------------------------- layout

def _touches(n: Node) -> Iterator[tuple[Operand, str]]:
    """(operand, smem tile) for each tile or slot operand of ``n`` (not an mbarrier, not a gmem view)."""
    for o, a in _operands(n):
        if o.memory and o.kind in ("buf", "slot") and buffer_name(a) is not None:
            yield o, buffer_name(a)


@rule("layout.swizzle", "layout", "ops that touch a swizzled smem tile address it one way: all swizzled (TMA, "
      "cp_async_bar, wgmma, sqnorm_rows, the elementwise ops) or all row-major; an elementwise op reads a "
      "swizzle-128 tile of whole 128-byte rows at its own elements",
      guards=(op for op, d in REGISTRY.items() if d.allocates is Alloc.SMEM))
def _swizzle(ctx: Ctx) -> Iterable[Diagnostic]:
    """A swizzled tile's bytes are where TMA and wgmma put them (``OpDef.swizzle``); an op that addresses it
    row-major (a plain load or store, a reduction, an fma mma, a transpose) would read or write other elements
    than the ones it names, silently, and the interpreter (which keeps tiles logical) would not see it."""
    swizzled = {name for name, t in ctx.buffers.items() if t.space is MemSpace.SMEM and ctx.swizzle_of(name)}
    if not swizzled:
        return
    uses: dict[str, list[tuple[Node, str, bool]]] = {}
    for n, path, _ in ctx.nodes:
        for o, name in _touches(n):
            if name in swizzled:
                uses.setdefault(name, []).append((n, path, REGISTRY[n.op].swizzle))
    for name, seen in uses.items():
        t, span = ctx.buffers[name], ctx.swizzle_of(name)
        shape = [ctx.static(d) for d in t.shape]
        row_bytes = shape[-1] * t.dtype.bytes if shape and shape[-1] is not None else None
        for n, path, aware in seen:
            if not aware or n.decl.family is not Family.ELEMENTWISE:
                continue
            dst = ctx.buffers.get(n.args[0]) if n.args and isinstance(n.args[0], str) else None
            if span != 128 or len(shape) != 2 or row_bytes is None or row_bytes % 128:
                yield ctx.diag("layout.swizzle", n, f"`{n.op.value}` touches `{name}` {fmt_shape(ctx, t.shape)} with "
                                                    f"swizzle={span}: elementwise ops address swizzle-128 tiles of "
                                                    "whole 128-byte rows", path=path,
                               hint=f"allocate `{name}` with swizzle=128 and rows of 128 bytes (or a multiple), or "
                                    "with swizzle=0")
            elif dst is not None and [ctx.static(d) for d in dst.shape] != shape:
                yield ctx.diag("layout.swizzle", n, f"`{n.op.value}` reads swizzled `{name}` broadcast to "
                                                    f"{fmt_shape(ctx, dst.shape)}: a broadcast read addresses it "
                                                    "row-major", path=path,
                               hint=f"read `{name}` at its own elements (a destination of its shape), or allocate it "
                                    "with swizzle=0")
        placed = next(((n, p) for n, p, aware in seen if aware), None)
        if placed is None:
            continue            # every op addresses it row-major: its swizzle attribute changes nothing
        for n, path, aware in seen:
            if not aware:
                yield ctx.diag("layout.swizzle", n, f"`{n.op.value}` addresses `{name}` row-major, but it has "
                                                    f"swizzle={span} and `{placed[0].op.value}` at line "
                                                    f"{placed[0].line} addresses it swizzled: the two disagree on "
                                                    "where each element is", path=path,
                               witness=[f"swizzled: {placed[0].op.value} at line {placed[0].line}"],
                               hint=f"use ops that follow the swizzle on `{name}` (tma_load, cp_async_bar, wgmma, "
                                    "the elementwise ops), or give the row-major ops a tile of their own with "
                                    "swizzle=0")
                break


# -------------------------------------------------------------------- target

@rule("target.grid", "target", "the grid has 1 to 3 dimensions with positive static parts")
def _grid(ctx: Ctx) -> Iterable[Diagnostic]:
    for g in ctx.program.grid:
        v = ctx.static(g)
        if v is not None and v < 1:
            yield ctx.diag("target.grid", None, f"grid extent `{g}` is {v}", path="kernel",
                           hint="grid extents must be at least 1")


# --------------------------------------------------------------------- races

_TRACKED = frozenset(op for op, d in REGISTRY.items() if d.ordering is Ordering.BARRIER)
_SYNCS = frozenset(op for op, d in REGISTRY.items() if d.sync is SyncKind.CTA)
# compute ops lowered with a CTA barrier before and after them (one thread per line: lower_compute._line_op)
_FENCED = frozenset({Op.REDUCE, Op.SCAN, Op.ARGMIN, Op.ARGMAX, Op.ARGMIN_UPDATE, Op.TOPK_MERGE, Op.TRISOLVE})
# compute ops lowered as a loop over the destination's elements, e = s * THREADS + tid, with no barrier (one
# before them where they stage an rmem operand): a source read at the same element is read by the thread that
# owns it, any other (a broadcast, a transpose's source) by other threads
_OWNED = frozenset({Op.FILL, Op.CAST, Op.UNARY, Op.EWISE, Op.SELECT, Op.IOTA, Op.TRANSPOSE})


@rule("races.smem", "races", "a shared-memory tile is read and written without a barrier between",
      guards=_TRACKED | _SYNCS | _FENCED | _OWNED)
def _races(ctx: Ctx) -> Iterable[Diagnostic]:
    """Simulate the statement order (loop bodies twice, so the wrap into the next
    trip is seen) and track, per smem tile, accesses since the last sync().
    Tile ops are collective and distributed, so an access by one thread may
    touch elements another thread accesses: both read-after-write and
    write-after-read need a barrier. The ops followed are those whose declaration
    says sync() orders them (``Ordering.BARRIER``); role blocks are the protocol
    checker's (sync() cannot stand in them). The compute ops are followed as they are lowered: an axis op
    (``reduce``, ``scan``...) runs between two CTA barriers; an elementwise op (``ewise``, ``unary``, ``fill``,
    ``transpose``...) loops over its destination's elements with no barrier (one before it where it stages an
    rmem operand), each element by the thread that owns it, so two such accesses to a tile at the same element
    are one thread's and do not race, while a broadcast or transposed read of a tile another op wrote does.

    A ``cp_async`` copy lands when a ``cp_async_wait(n)`` retires its group (each copy commits one; the wait
    leaves the newest n in flight), not at the next sync(): until then its write stays pending across barriers.
    A block under ``if`` may or may not run, so after it the groups in flight are those of either path."""
    smem = {name for name, t in ctx.buffers.items() if t.space is MemSpace.SMEM}
    reported: set[tuple[int, int]] = set()
    pending: dict[str, list[tuple[str, Node, int]]] = {}
    inflight: list[tuple[int, str, Node, int]] = []      # cp.async groups not yet retired: (order, tile, op, trip)
    issued = itertools.count()
    out: list[Diagnostic] = []

    def barrier() -> None:
        pending.clear()
        for _, buf, pn, ptrip in inflight:      # still landing: the barrier does not order them
            pending.setdefault(buf, []).append(("landing", pn, ptrip, False))

    def run(nodes: tuple[Node, ...], trip: int) -> None:
        nonlocal inflight
        for n in nodes:
            if n.op in _SYNCS or n.op in _FENCED or (n.op in _OWNED and _stages(ctx, n)):
                barrier()
            elif n.op is Op.CP_ASYNC_WAIT:
                keep = ctx.static(n.args[0]) if n.args[0] else 0
                if keep is not None:                    # an unknown count retires nothing
                    inflight = inflight[len(inflight) - keep:] if keep else []
            elif n.op is Op.FOR:
                run(n.body, 1)
                run(n.body, 2)
            elif n.op is Op.IF:
                before = list(inflight)
                run(n.body, trip)      # may run: its accesses count
                inflight = sorted(set(before) | set(inflight), key=lambda g: g[0])
            if n.op is Op.CP_ASYNC and buffer_name(n.arg("dst")) in smem:
                inflight.append((next(issued), buffer_name(n.arg("dst")), n, trip))
            accesses = smem_accesses(n, smem, _operands) if n.op in _TRACKED | _FENCED | _OWNED else []
            owned = owned_accesses(ctx, n, smem, _operands) if n.op in _OWNED else set()
            recorded: list[tuple[str, tuple[str, Node, int, bool]]] = []
            for kind, buf in accesses:      # an op's own accesses do not race with each other
                mine = (kind, buf) in owned
                for pkind, pn, ptrip, pmine in pending.get(buf, []):
                    if mine and pmine:
                        continue        # the same element, by the thread that owns it
                    if conflict(kind, pkind) and (pn.line, n.line) not in reported:
                        reported.add((pn.line, n.line))
                        path = next((p for m, p, _ in ctx.nodes if m is n), "")
                        if pkind == "landing":
                            out.append(ctx.diag(
                                "races.smem", n, f"read of smem tile `{buf}` while the cp_async at line {pn.line} "
                                                 "may still be landing: no cp_async_wait retired its group",
                                path=path, witness=[f"copy: cp_async at line {pn.line} (trip {ptrip}), in flight",
                                                    f"read: {n.op.value} at line {n.line} (trip {trip})"],
                                hint="cp_async_wait(n) then sync() before the read, with n at most the number of "
                                     "cp_async copies issued after that one"))
                            continue
                        what = f"{kind}-after-{pkind}"
                        out.append(ctx.diag(
                            "races.smem", n, f"{what} race on smem tile `{buf}`: no sync() between the "
                                             f"{pkind} at line {pn.line} and this {kind}",
                            path=path,
                            witness=[f"{pkind}: {pn.op.value} at line {pn.line} (trip {ptrip})",
                                     f"{kind}: {n.op.value} at line {n.line} (trip {trip})"],
                            hint="insert sync() between them"))
                recorded.append((buf, (kind, n, trip, mine)))
            for buf, access in recorded:
                pending.setdefault(buf, []).append(access)
            if n.op in _FENCED:
                barrier()

    run(ctx.program.body, 1)
    return out


def _stages(ctx: Ctx, n: Node) -> bool:
    """Whether an elementwise op's lowering stages an rmem operand through scratch (a barrier before it)."""
    def shape(t):
        dims = tuple(ctx.static(d) for d in t.shape)
        return None if any(d is None for d in dims) else dims
    return bool(staged_operands(n, ctx.buffers.get, shape, layouts(ctx)))
