"""Lowering of allocation and the CTA-wide tile ops onto ``header/cake.cuh`` and ``cake_mma.cuh``: smem, rmem,
load, store, sync, mma (``atom="fma"`` and ``atom="mma_sync"``), and the mma_sync fragment layout.

- ``smem``: a slice of dynamic shared memory at an offset aligned to the target's ``smem_alloc_align_bytes``
  (``tma.swizzle_smem_align_bytes`` for a swizzle-128 tile: its pattern is address-based), ``stages`` copies
  of the shape; the buffer keeps its swizzle (wgmma descriptors read it). ``rmem``: a per-thread register
  array of numel / threads slots, filled with ``fill``.
- ``load`` / ``store``: gmem windows of rank ≤ 2 after dropped (single-index) dimensions
  (``lower.unsupported_rank`` beyond), guarded or not.
- ``mma``, one variant per atom: ``fma`` (fp32 FMAs over the CTA-distributed acc) and ``mma_sync`` (tensor cores:
  ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}``, operands from smem through ``ldmatrix`` /
  ``ldmatrix.trans``; f32 operands as three ``m16n8k8`` tf32 products an atom, the 3xTF32 split that keeps
  fp32's accuracy, read with plain smem loads). ``atom="wgmma"`` on ``mma`` is not lowered
  (``lower.unsupported_atom``): use the ``wgmma`` op (lower_wgmma).
- The mma_sync accumulator layout. An rmem tile that ``mma(..., atom="mma_sync")`` accumulates into is held in
  the mma.sync fragment layout, not in the IR's default distribution (element e in thread e % threads): the
  CTA's warps form a WM x WN grid (warp w at (w // WN, w % WN)), each owns an (M/WM) x (N/WN) block of m16n8
  atoms, and slot (mi*NI + ni)*4 + j of lane l holds row mi*16 + l//4 + 8*(j//2), column ni*8 + 2*(l%4) + j%2
  of its block (cake_mma.cuh has the full formula). WM, WN are chosen here (:func:`warp_grid`: the fewest
  ldmatrix per 16 of K). The per-thread slot count is numel / threads as for any rmem tile, so
  ``rmem(fill=...)`` and the slot-wise elementwise ops (``fill``, ``cast``, ``unary``, ``ewise``, ``select`` whose
  rmem operands all have the acc's shape) are layout-agnostic; rmem tiles tied to an accumulator by such ops take
  its layout too (:func:`fragment_names`). Those ops and ``iota`` may also name smem tiles: the loop takes each
  slot's (row, column) from ``mma_layout::coord`` and reads or writes an smem tile there, a broadcast one at the
  row or column (``thread_map``'s ``mma`` map). ``load`` into and ``store`` from a fragment-layout tile go through
  ``mma_layout::coord``, as do ``atomic_add`` and ``scatter_add`` from one (a split-K epilogue). Any other op that
  names such a tile is refused (``lower.acc_layout``,
  :func:`layout_guard`), as is an ``mma`` of another atom into it. Preconditions, each a ``LowerError`` at the
  IR line: ``lower.mma_tiling`` (M = WM * 16 * i and N = WN * 8 * j for some warp grid WM * WN = threads/32; K a
  multiple of 16, of 8 for f32 operands), ``lower.unsupported_operand`` (bf16, f16 or f32 a and b in smem, f32
  acc).
"""
from __future__ import annotations

import math

from cake_core.ir.expr import evaluate
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.program import walk
from cake_core.ir.types import DType, MemSpace, Swizzle, TileType
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, box_args, c_literal, window
from cake_core.targets import Arch


def lower_smem(n: Node, ctx: Ctx) -> list[Line]:
    dtype, shape = n.args
    static = tuple(ctx.static(d, "an smem shape") for d in shape)
    stages = n.attr("stages")
    off = ctx.smem_region(n, f"smem tile `{n.result}`").offset    # aligned there (a swizzle-128 tile: 1024 B)
    t = TileType(dtype, tuple(shape), MemSpace.SMEM, Swizzle(n.attr("swizzle")), stages)
    b = Buf(n.result, t, static, off)
    ctx.scopes[-1][n.result] = b
    return [f"{dtype.c_type}* const {n.result} = reinterpret_cast<{dtype.c_type}*>(cake_smem + {off});"
            f"  // {stages} x {static}, {stages * b.numel * dtype.bytes} B"]


def lower_rmem(n: Node, ctx: Ctx) -> list[Line]:
    dtype, shape = n.args
    static = tuple(ctx.static(d, "an rmem shape") for d in shape)
    numel = math.prod(static)
    if numel % ctx.threads:
        raise LowerError("lower.rmem_distribution", f"rmem tile `{n.result}` has {numel} elements, not a multiple "
                                                    f"of the CTA's {ctx.threads} threads",
                         "pick a shape whose element count divides evenly over the threads")
    layout = None
    if n.result in fragment_names(ctx):
        layout = warp_grid(static, ctx.threads, n.result, ctx.arch)
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), static, layout=layout)
    where = f"mma_sync fragments, {layout[0]}x{layout[1]} warps" if layout else f"over {ctx.threads} threads"
    return [f"{dtype.c_type} {n.result}[{numel // ctx.threads}];  // {static} {where}",
            f"cake::fill_rmem({n.result}, {c_literal(n.attr('fill'), dtype)});"]


def lower_load(n: Node, ctx: Ctx) -> list[Line]:
    dst_name, view = n.args
    dst = ctx.buf(dst_name, (MemSpace.SMEM, MemSpace.RMEM), "destination")
    w = window(view, dst.shape, ctx, "source")
    guard = "true" if n.attr("guard") else "false"
    if dst.layout is not None:
        m, nn = dst.shape
        return [f"cake::load_mma_acc_gmem<{w.rows}, {w.cols}, {m}, {nn}, THREADS, {dst.layout[0]}, {dst.layout[1]}, "
                f"{guard}>({dst_name}, {w.base}, {box_args(w)});"]
    fn = "load_smem_gmem" if dst.type.space is MemSpace.SMEM else "load_rmem_gmem"
    return [f"cake::{fn}<{w.rows}, {w.cols}, THREADS, {guard}>({dst_name}, {w.base}, {box_args(w)});"]


def lower_gather(n: Node, ctx: Ctx) -> list[Line]:
    """``gather(dst, src[:, tile(c, C)], idx, base=B, limit=L)`` → ``cake::gather_smem_gmem``: the window seen as a
    box of the destination's rows, its row stride the gathered dimension's."""
    dst_name, view, idx = n.arg("dst"), n.arg("src"), n.arg("idx")
    dst = ctx.buf(dst_name, (MemSpace.SMEM,), "destination")
    if len(dst.shape) != 2 or dst.type.swizzle is not Swizzle.NONE:
        raise LowerError("lower.unsupported_operand", f"gather writes a 2-D unswizzled smem tile; `{dst_name}` is "
                                                      f"{dst.type}")
    ctx.buf(idx, (MemSpace.GMEM,), "gather's indices")
    w = window(view, dst.shape, ctx, "source")
    base, limit = (ctx.check_expr(n.arg(k), f"gather's {k}") for k in ("base", "limit"))
    return [f"cake::gather_smem_gmem<{w.rows}, {w.cols}, THREADS>({dst_name}, {w.base}, {w.ld_row}, {w.ld_col}, "
            f"{w.rows_in}, {w.cols_in}, {idx}, {base}, {limit});"]


def lower_store(n: Node, ctx: Ctx) -> list[Line]:
    view, src_name = n.args
    src = ctx.buf(src_name, (MemSpace.SMEM, MemSpace.RMEM), "source")
    w = window(view, src.shape, ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    if src.layout is not None:
        m, nn = src.shape
        return [f"cake::store_gmem_mma_acc<{w.rows}, {w.cols}, {m}, {nn}, THREADS, {src.layout[0]}, {src.layout[1]}, "
                f"{guard}>({w.base}, {src_name}, {box_args(w)});"]
    fn = "store_gmem_smem" if src.type.space is MemSpace.SMEM else "store_gmem_rmem"
    return [f"cake::{fn}<{w.rows}, {w.cols}, THREADS, {guard}>({w.base}, {src_name}, {box_args(w)});"]


def lower_sync(n: Node, ctx: Ctx) -> list[Line]:
    return ["__syncthreads();"]


# ----------------------------------------------------------------- mma, one variant per atom

def atom_is(*atoms: str):
    """The predicate of an mma variant: the node's ``atom`` attribute is one of ``atoms``."""
    def pred(n: Node, ctx: Ctx) -> bool:
        return n.attr("atom") in atoms
    return pred


def refuse_mma_atom(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_atom", f'mma atom "{n.attr("atom")}" is not lowered yet; mma lowers '
                                               'atom="fma" and atom="mma_sync"',
                     'use atom="mma_sync" for tensor cores, or the wgmma op (sm_90a) for warpgroup MMA')


def _mma_operands(n: Node, ctx: Ctx) -> tuple[Buf, Buf, Buf, int, int, int]:
    """acc (M, N) rmem f32, a (M, K) and b (K, N) in smem, and M, N, K."""
    acc_n, a_n, b_n = n.args
    acc = ctx.buf(acc_n, (MemSpace.RMEM,), "accumulator")
    a = ctx.buf(a_n, (MemSpace.SMEM,), "operand a")
    b = ctx.buf(b_n, (MemSpace.SMEM,), "operand b")
    if acc.type.dtype is not DType.F32:
        raise LowerError("lower.unsupported_operand", f"accumulator `{acc_n}` is {acc.type.dtype.value}; f32 needed")
    for x in (acc, a, b):
        if len(x.shape) != 2:
            raise LowerError("lower.shape_mismatch", f"mma operand `{x.name}` has rank {len(x.shape)}; 2 needed")
    (m, nn), (am, k), (bk, bn) = acc.shape, a.shape, b.shape
    if (am, bk, bn) != (m, k, nn):
        raise LowerError("lower.shape_mismatch", f"mma shapes disagree: acc {acc.shape}, a {a.shape}, b {b.shape}",
                         "acc is (M, N), a is (M, K), b is (K, N)")
    return acc, a, b, m, nn, k


def lower_mma_fma(n: Node, ctx: Ctx) -> list[Line]:
    acc, a, b, m, nn, k = _mma_operands(n, ctx)
    if acc.layout is not None:
        raise LowerError("lower.acc_layout", f'`{acc.name}` is an mma_sync accumulator (fragment layout); '
                                             'an mma with atom="fma" cannot accumulate into it',
                         "use one atom per accumulator")
    return [f"cake::mma_fma_rmem_smem<{m}, {nn}, {k}, THREADS>({acc.name}, {a.name}, {b.name});"]


def lower_mma_sync(n: Node, ctx: Ctx) -> list[Line]:
    acc, a, b, m, nn, k = _mma_operands(n, ctx)
    arch = ctx.arch
    if "mma_sync" not in arch.mma_atoms:
        raise LowerError("lower.unsupported_atom", f'atom="mma_sync" (m16n8k16 bf16/f16) needs sm_80 or newer, '
                                                   f"not {arch.arch}")
    if a.type.dtype is not b.type.dtype or a.type.dtype not in (DType.BF16, DType.F16, DType.F32):
        raise LowerError("lower.unsupported_operand", f'atom="mma_sync" takes bf16, f16 or f32 a and b of one dtype; '
                                                      f"a is {a.type.dtype.value}, b is {b.type.dtype.value}",
                         'allocate both smem tiles as bf16 (or f16, or f32), or use atom="fma"')
    if a.type.swizzle.value or b.type.swizzle.value:
        raise LowerError("lower.unsupported_layout", 'atom="mma_sync" reads plain row-major smem tiles; '
                                                     f"`{a.name if a.type.swizzle.value else b.name}` is swizzled",
                         "allocate the operands with swizzle=0")
    f32 = a.type.dtype is DType.F32
    step = arch.mma_sync.k_32bit if f32 else arch.mma_sync.k_16bit
    if k % step:
        raise LowerError("lower.mma_tiling", f'atom="mma_sync" steps K by {step}; K = {k} is not a multiple of {step}',
                         f"make the K tile (e.g. BK) a multiple of {step}")
    if acc.layout is None:
        raise LowerError("lower.acc_layout", f"accumulator `{acc.name}` is not in the mma_sync fragment layout",
                         "allocate the accumulator with rmem(...) in this kernel")
    wm, wn = acc.layout
    helper = "mma_sync_tf32x3_rmem_smem" if f32 else "mma_sync_rmem_smem"
    return [f"cake::{helper}<{m}, {nn}, {k}, THREADS, {wm}, {wn}>({acc.name}, {a.name}, {b.name});"
            f"  // {wm}x{wn} warps, {m // wm}x{nn // wn} per warp" + ("; f32 as 3 tf32 products" if f32 else "")]


# ------------------------------------------------------- mma_sync fragment layout (see the module docstring)

_SLOTWISE = (Op.FILL, Op.CAST, Op.UNARY, Op.EWISE, Op.SELECT)   # lowered slot by slot when operand shapes agree


def _buf_operands(n: Node) -> list[str]:
    """Names of the smem/rmem tiles a node reads or writes (views name gmem and are left out)."""
    out = []
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.kind == "buf" and isinstance(a, str):
            out.append(a)
        elif o.kind == "slot" and hasattr(a, "buf"):
            out.append(a.buf)
    return out


def fragment_names(ctx: Ctx) -> frozenset[str]:
    """rmem tiles in the mma_sync fragment layout: accumulators of mma(atom="mma_sync"), and rmem tiles of
    the same shape tied to one by a slot-wise elementwise op (transitively)."""
    cached = ctx.__dict__.get("mma_frag_names")
    if cached is not None:
        return cached
    nodes = [w[0] for w in walk(ctx.program.body)]
    rmem_shape: dict[str, tuple] = {}
    for n in nodes:
        if n.op is Op.RMEM and n.result:
            try:
                rmem_shape[n.result] = tuple(evaluate(d, ctx.consts) for d in n.args[1])
            except Exception:  # noqa: BLE001 - a dynamic shape: the rmem lowering reports it
                rmem_shape[n.result] = (None,)
    frag = {n.arg("acc") for n in nodes if n.op is Op.MMA and n.attr("atom") == "mma_sync"}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.op not in _SLOTWISE:
                continue
            names = [x for x in _buf_operands(n) if x in rmem_shape]
            shapes = {rmem_shape[x] for x in names if x in frag}
            for x in names:
                if x not in frag and rmem_shape[x] in shapes:
                    frag.add(x)
                    changed = True
    out = frozenset(frag)
    ctx.__dict__["mma_frag_names"] = out
    return out


def warp_grid(shape: tuple[int, ...], threads: int, name: str, arch: Arch) -> tuple[int, int]:
    """(WM, WN) warps tiling an (M, N) mma_sync accumulator with m16n8 atoms: the grid with the fewest
    ldmatrix per warp per 16 of K (MI x4 for A, ceil(NI / 2) for B), ties to more warp rows."""
    if len(shape) != 2:
        raise LowerError("lower.shape_mismatch", f"mma_sync accumulator `{name}` has rank {len(shape)}; 2 needed")
    m, nn = shape
    am, an = arch.mma_sync.m, arch.mma_sync.n
    warps = threads // arch.warp_size
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if m % (am * wm) or nn % (an * wn):
            continue
        mi, ni = m // wm // am, nn // wn // an
        cost = (mi + (ni + 1) // 2, -wm)
        if best is None or cost < best[0]:
            best = (cost, (wm, wn))
    if best is None:
        raise LowerError("lower.mma_tiling",
                         f"mma_sync accumulator `{name}` ({m}, {nn}) cannot be tiled by the CTA's {warps} warps in "
                         f"m{am}n{an} atoms: no warp grid WM x WN = "
                         f"{warps} has M divisible by {am} * WM and N divisible by {an} * WN",
                         f"e.g. make M a multiple of {am * warps} or N a multiple of {an * warps}, or use fewer threads")
    return best[1]


def src_is_fragment(n: Node, ctx: Ctx) -> bool:
    """Whether the node's ``src`` is an rmem tile in the mma_sync fragment layout (its atomic add or scatter add
    then follows that layout: ``cake::store_gmem_mma_acc<..., ADD=true>``, ``cake::scatter_add_gmem_mma_acc``)."""
    return n.arg("src") in fragment_names(ctx)


def layout_guard(n: Node, ctx: Ctx) -> None:
    """Refuse a node that touches a fragment-layout rmem tile unless its lowering follows that layout (the
    dispatch runs this before every hook that does not handle the layout itself)."""
    names = _buf_operands(n)
    frag = fragment_names(ctx)
    hit = [x for x in names if x in frag]
    if not hit:
        return
    if n.op in _SLOTWISE or n.op is Op.IOTA:
        bufs = []
        for x in names:
            try:
                bufs.append(ctx.buf(x, (MemSpace.SMEM, MemSpace.RMEM), "operand"))
            except LowerError:
                return    # the op's own hook reports it
        rmem = [b for b in bufs if b.type.space is MemSpace.RMEM]
        # every rmem operand in one fragment layout (slot by slot); smem ones read or written at the slot's
        # (row, column) or broadcast from it (thread_map's ``mma`` map)
        if rmem and all(b.layout is not None and b.shape == rmem[0].shape and b.layout == rmem[0].layout
                        for b in rmem):
            return
    raise LowerError("lower.acc_layout",
                     f"`{hit[0]}` is an mma_sync accumulator (fragment layout: see the lowering's docstring); "
                     f"`{n.op.value}` here would address its elements in the default distribution",
                     "store it to gmem (or use fill/cast/unary/ewise/select/iota whose rmem operands are "
                     'fragments of its shape, beside smem tiles), or accumulate with atom="fma"')


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.SMEM: lower_smem,
    Op.SYNC: lower_sync,
}
