"""Cake IR → one CUDA C++ translation unit (sm_90a first), with ``#line`` maps to the IR.

The kernel is written onto ``header/cake.cuh`` (our own device header). Every
line of generated code is preceded by ``#line N "<ir file>"`` naming the IR
statement it came from, so an nvcc error lands on the IR line that caused it.

Lowering hooks live in :data:`LOWERINGS`, keyed by ``Op``: a new op is one
registration there (a test checks that every registered op has one). A hook
takes the node and the lowering context and returns the C++ lines of that
statement; it raises :class:`LowerError` when it cannot lower the node, which
becomes a ``COMPILE_FAILED`` diagnostic at the node's IR line. All diagnostics
of a program are collected, not just the first.

What is lowered in v1 (and what is not, with its rule id):
- ``smem``: a slice of dynamic shared memory at a 128-byte aligned offset
  (``stages`` copies of the shape); ``rmem``: a per-thread register array of
  numel / threads slots, filled with ``fill``.
- ``load`` / ``store``: gmem windows of rank ≤ 2 after dropped (single-index)
  dimensions (``lower.unsupported_rank`` beyond), guarded or not.
- ``mma`` with ``atom="fma"`` (fp32 FMAs over the CTA-distributed acc) and ``atom="mma_sync"``
  (tensor cores: ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}``, operands from smem through
  ``ldmatrix`` / ``ldmatrix.trans``; ``header/cake_mma.cuh``). ``atom="wgmma"`` on ``mma`` is not
  lowered (``lower.unsupported_atom``): use the ``wgmma`` op (lower_async).
- The mma_sync accumulator layout. An rmem tile that ``mma(..., atom="mma_sync")`` accumulates
  into is held in the mma.sync fragment layout, not in the IR's default distribution (element e in
  thread e % threads): the CTA's warps form a WM x WN grid (warp w at (w // WN, w % WN)), each owns
  an (M/WM) x (N/WN) block of m16n8 atoms, and slot (mi*NI + ni)*4 + j of lane l holds row
  mi*16 + l//4 + 8*(j//2), column ni*8 + 2*(l%4) + j%2 of its block (cake_mma.cuh has the full
  formula). WM, WN are chosen here (:func:`_warp_grid`: the fewest ldmatrix per 16 of K). The
  per-thread slot count is numel / threads as for any rmem tile, so ``rmem(fill=...)`` and the
  slot-wise elementwise ops (``fill``, ``cast``, ``unary``, ``ewise`` whose rmem operands all have the
  acc's shape) are layout-agnostic; rmem tiles tied to an accumulator by such ops take its layout
  too (:func:`_frag_names`). ``load`` into and ``store`` from a fragment-layout tile go through
  ``mma_layout::coord``. Any other op that names such a tile is refused (``lower.acc_layout``), as is
  an ``mma`` of another atom into it. Preconditions, each a ``LowerError`` at the IR line:
  ``lower.mma_tiling`` (M = WM * 16 * i and N = WN * 8 * j for some warp grid WM * WN = threads/32;
  K a multiple of 16), ``lower.unsupported_operand`` (bf16/f16 a and b in smem, f32 acc).
- ``name = expr`` (``let``) → ``const int name = expr;`` in the C block of its IR block (the same int
  arithmetic as the expression written inline at each use).
- ``sync`` → ``__syncthreads()``; ``for`` → a C ``for`` loop (``#pragma unroll``); ``range(start, stop,
  step)`` keeps its bounds (``ncta.x`` → ``gridDim.x``). A grid that uses ``num_sms`` is evaluated at launch
  with the GPU's SM count (``LoweredKernel.grid_for(shape, num_sms)``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Union

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, LAUNCH_SYMBOLS, Expr, UnboundSymbol, c_expr, evaluate, symbols
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Tile, View, loop_range
from cake_core.ir.program import Program, walk
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.ir.zeroing import accumulated_params
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult

HEADER_NAME = "cake.cuh"
SMEM_ALIGN = 128          # bytes between smem buffers (TMA/wgmma need ≥ 128 later)
STAGE = "lower"

# Names the generated code uses for itself, and C++ keywords an IR name must not shadow.
_RESERVED = {
    "THREADS", "cake", "cake_smem", "cake_cdiv", "cake_min", "cake_max", "threadIdx", "blockIdx",
    "blockDim", "gridDim", "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch",
    "char", "class", "const", "constexpr", "continue", "default", "delete", "do", "double", "else", "enum",
    "explicit", "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int", "long",
    "mutable", "namespace", "new", "not", "operator", "or", "private", "protected", "public", "register",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw",
    "true", "try", "typedef", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
    "while", "xor", "half", "dim3",
}


# --------------------------------------------------------------------- products

@dataclass(frozen=True)
class KernelArg:
    """One gmem kernel parameter: its IR type and whether the kernel writes it."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    written: bool


@dataclass(frozen=True)
class LoweredKernel:
    """The lowering's product: CUDA source plus what a launcher needs.

    ``params`` are the pointer arguments in order, then ``dims`` as ``int``
    arguments, then one ``const __grid_constant__ cake::tensor_map`` (a 128-byte
    CUtensorMap, by value) per entry of ``tensor_maps``, in order: the launcher
    encodes each with ``cuTensorMapEncodeTiled`` (see ``lower_async.TensorMapArg``
    for the fields). ``grid`` is evaluated at launch with ``consts`` and the shape;
    ``smem_bytes`` is the dynamic shared memory per CTA (mbarriers included; above
    48 KiB the launcher must raise ``cudaFuncAttributeMaxDynamicSharedMemorySize``);
    ``cluster``, when set, is compiled in as ``__cluster_dims__``. ``accumulates``: the parameters the
    kernel reads or adds into: of a problem's zeroed outputs, only those are zeroed before a launch.
    """

    source: str
    kernel_name: str
    smem_bytes: int
    threads: int
    params: tuple[KernelArg, ...]
    dims: tuple[str, ...]
    grid: tuple[Expr, ...]
    consts: tuple[tuple[str, int], ...] = ()
    target: str = "sm_90a"
    ir_filename: str = "kernel.cake"
    tensor_maps: tuple = ()          # lower_async.TensorMapArg, in kernel-argument order
    cluster: tuple[int, ...] = ()
    accumulates: tuple[str, ...] | None = None   # params read or added into (ir.zeroing); None: unknown

    def grid_for(self, shape: dict[str, int], num_sms: int | None = None) -> tuple[int, ...]:
        """The launch grid for ``shape``; ``num_sms`` (the GPU's SM count) is needed when the grid uses it."""
        env = {**dict(self.consts), **shape}
        if num_sms is not None:
            env["num_sms"] = num_sms
        try:
            return tuple(int(evaluate(g, env)) for g in self.grid)
        except UnboundSymbol as u:
            if u.name in LAUNCH_SYMBOLS:
                raise ValueError(f"the grid of {self.kernel_name} uses `{u.name}`: pass num_sms, the SM count of "
                                 "the GPU it is launched on") from None
            raise

    @property
    def persistent(self) -> bool:
        """The grid is sized by the GPU (``num_sms``), not by the problem alone."""
        return any(s in LAUNCH_SYMBOLS for g in self.grid for s in symbols(g))


class LowerError(Exception):
    """A node that cannot be lowered: becomes a Diagnostic at the node's IR line."""

    def __init__(self, rule: str, message: str, hint: str = ""):
        super().__init__(message)
        self.rule, self.message, self.hint = rule, message, hint


# --------------------------------------------------------------------- context

@dataclass
class Buf:
    name: str
    type: TileType
    shape: tuple[int, ...]      # static (evaluated with the consts); () for gmem
    smem_offset: int = -1
    layout: tuple[int, int] | None = None   # rmem in the mma_sync fragment layout: its warp grid (WM, WN)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Line = Union[str, tuple[int, str]]   # plain text (the node's IR line) or (IR line, text)


@dataclass
class Ctx:
    program: Program
    filename: str
    dims: tuple[str, ...]
    gmem: dict[str, Buf]
    scopes: list[dict[str, Buf]] = field(default_factory=lambda: [{}])
    loop_vars: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)          # bindings (`let`) in scope, innermost last
    smem_top: int = 0
    diags: list[Diagnostic] = field(default_factory=list)
    paths: dict[int, str] = field(default_factory=dict)     # id(node) -> IR path
    depth: int = 1

    @property
    def threads(self) -> int:
        return self.program.threads

    @property
    def consts(self) -> dict[str, int]:
        return self.program.const_env

    def buf(self, name: str, spaces: tuple[MemSpace, ...], role: str) -> Buf:
        b = self.gmem.get(name)
        for scope in reversed(self.scopes):
            if name in scope:
                b = scope[name]
                break
        if b is None:
            raise LowerError("lower.unknown_name", f"{role} `{name}` names no buffer in scope",
                             "allocate it with smem(...)/rmem(...) before this statement, in this loop or above")
        if b.type.space not in spaces:
            want = " or ".join(s.value for s in spaces)
            raise LowerError("lower.unsupported_operand",
                             f"{role} `{name}` is {b.type.space.value}; this op takes {want} here")
        return b

    def check_expr(self, e: Expr, what: str) -> str:
        known = set(self.consts) | set(self.dims) | set(self.loop_vars) | set(self.bound) | set(CTA_COORDS) | \
            set(CTA_COUNTS)
        unknown = sorted(symbols(e) - known)
        if unknown:
            raise LowerError("lower.unknown_name", f"{what} uses `{unknown[0]}`, which is not a const, a problem "
                                                   "dimension, a loop variable or binding in scope, bid.x/y/z or "
                                                   "ncta.x/y/z",
                             "declare it in consts={...} or use a dimension of a gmem parameter (num_sms: in "
                             "the grid only)")
        # blockIdx and gridDim are unsigned: as int, `M - bid.y * BM` stays signed (guards compare against it)
        return re.sub(r"(blockIdx|gridDim)\.([xyz])", r"((int)\1.\2)", c_expr(e))

    def static(self, e: Expr, what: str) -> int:
        try:
            v = evaluate(e, self.consts)
        except UnboundSymbol as u:
            raise LowerError("lower.dynamic_shape", f"{what} must be known at compile time, but uses `{u.name}`",
                             "use integers and consts only") from None
        if not isinstance(v, int) or v < 1:
            raise LowerError("lower.dynamic_shape", f"{what} evaluates to {v!r}; a positive integer is needed")
        return v

    def lower_nested(self, nodes: tuple[Node, ...], loop_var: str | None = None) -> list[tuple[int, str]]:
        """Lower a block body one level deeper, in a scope of its own (and with ``loop_var`` bound)."""
        if loop_var is not None:
            self.loop_vars.append(loop_var)
        self.scopes.append({})
        self.depth += 1
        n_bound = len(self.bound)
        try:
            return self.lower_block(nodes)
        finally:
            del self.bound[n_bound:]        # the block's bindings end with it (as its C block does)
            self.depth -= 1
            self.scopes.pop()
            if loop_var is not None:
                self.loop_vars.pop()

    def lower_block(self, nodes: tuple[Node, ...]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for n in nodes:
            hook = LOWERINGS.get(n.op)
            try:
                if hook is None:
                    raise LowerError("lower.unknown_op", f"op `{n.op.value}` has no lowering")
                _layout_guard(n, self)
                lines = hook(n, self)
            except LowerError as e:
                self.diags.append(Diagnostic(e.rule, Severity.ERROR, e.message, n.line, n.col,
                                             self.paths.get(id(n), ""), e.hint))
                continue
            pad = "    " * self.depth
            for ln in lines:
                out.append(ln if isinstance(ln, tuple) else (n.line, pad + ln))
        return out


Lowering = Callable[[Node, Ctx], list[Line]]
LOWERINGS: dict[Op, Lowering] = {}


def lowering(op: Op) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        LOWERINGS[op] = fn
        return fn
    return deco


# --------------------------------------------------------------------- windows

@dataclass(frozen=True)
class Window:
    """A gmem view seen as a ROWS x COLS box (see cake.cuh)."""

    rows: int
    cols: int
    base: str          # C expression: pointer to the window's first element
    ld_row: str
    ld_col: str
    rows_in: str       # rows inside the tensor (guard)
    cols_in: str


def _window(view: View, tile_shape: tuple[int, ...], ctx: Ctx, role: str) -> Window:
    g = ctx.buf(view.buf, (MemSpace.GMEM,), role)
    dims = g.type.shape
    if len(view.index) != len(dims):
        raise LowerError("lower.shape_mismatch", f"view of `{view.buf}` has {len(view.index)} indices, "
                                                 f"the tensor has rank {len(dims)}")
    strides = [dims[d + 1:] for d in range(len(dims))]
    stride_c = ["(cake::index_t)1" if not s else " * ".join(f"(cake::index_t){ctx.check_expr(x, 'a tensor dimension')}"
                                                          for x in s) for s in strides]
    offset, kept, at_ok = [], [], []
    for d, ix in enumerate(view.index):
        dim_c = f"({ctx.check_expr(dims[d], 'a tensor dimension')})"
        if isinstance(ix, Tile):
            start = f"({ctx.check_expr(ix.index, 'a tile index')} * {ctx.check_expr(ix.size, 'a tile size')})"
            kept.append((d, start, dim_c))
            offset.append(f"(cake::index_t){start} * {stride_c[d]}")
        elif isinstance(ix, Full):
            kept.append((d, "0", dim_c))
        else:
            assert isinstance(ix, At)
            i = f"({ctx.check_expr(ix.index, 'an index')})"
            at_ok.append(f"({i} >= 0 && {i} < {dim_c})")
            offset.append(f"(cake::index_t){i} * {stride_c[d]}")
    if len(kept) > 2:
        raise LowerError("lower.unsupported_rank", f"the view of `{view.buf}` is a rank-{len(kept)} window; "
                                                   "v1 lowers windows of rank ≤ 2",
                         "index the outer dimensions with single indices (they are dropped)")
    sizes = [ctx.static(view.index[d].size, "a tile size") if isinstance(view.index[d], Tile) else None
             for d, _, _ in kept]
    if len(kept) == len(tile_shape):      # `:` dimensions take the tile's extent
        ext = [s if s is not None else t for s, t in zip(sizes, tile_shape)]
        same = tuple(ext) == tuple(tile_shape)
    else:                                 # e.g. a (1, BN) tile from b[k, tile(j, BN)]: same elements, same order
        ext = [s if s is not None else 0 for s in sizes]
        same = None not in sizes and math.prod(ext) == math.prod(tile_shape)
    if not same:
        raise LowerError("lower.shape_mismatch", f"the view of `{view.buf}` is a {tuple(sizes)} window but the "
                                                 f"tile is {tuple(tile_shape)}", "make the tile sizes match")
    base = f"{view.buf} + ({' + '.join(offset)})" if offset else view.buf
    ok = " && ".join(at_ok)
    guard_rows = lambda lim: f"(({ok}) ? {lim} : 0)" if ok else lim  # noqa: E731 - dropped dims out of range: nothing inside
    if len(kept) == 2:
        (dr, sr, nr), (dc, sc, nc) = kept
        return Window(ext[0], ext[1], base, stride_c[dr], stride_c[dc], guard_rows(f"({nr} - {sr})"), f"({nc} - {sc})")
    if len(kept) == 1:
        (dc, sc, nc), = kept
        return Window(1, ext[0], base, "(cake::index_t)0", stride_c[dc], guard_rows("1"), f"({nc} - {sc})")
    return Window(1, 1, base, "(cake::index_t)0", "(cake::index_t)0", guard_rows("1"), "1")


def _box_args(w: Window) -> str:
    return f"{w.ld_row}, {w.ld_col}, {w.rows_in}, {w.cols_in}"


# --------------------------------------------------------------------- lowerings

@lowering(Op.SMEM)
def _lower_smem(n: Node, ctx: Ctx) -> list[Line]:
    dtype, shape = n.args
    static = tuple(ctx.static(d, "an smem shape") for d in shape)
    stages = n.attr("stages")
    off = -(-ctx.smem_top // SMEM_ALIGN) * SMEM_ALIGN
    t = TileType(dtype, tuple(shape), MemSpace.SMEM, stages=stages)
    b = Buf(n.result, t, static, off)
    ctx.smem_top = off + stages * b.numel * dtype.bytes
    ctx.scopes[-1][n.result] = b
    return [f"{dtype.c_type}* const {n.result} = reinterpret_cast<{dtype.c_type}*>(cake_smem + {off});"
            f"  // {stages} x {static}, {stages * b.numel * dtype.bytes} B"]


def _c_literal(v: float, dtype: DType) -> str:
    if not dtype.is_float:
        return str(int(v))
    if math.isinf(v):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return f"{float(v)!r}f"


@lowering(Op.RMEM)
def _lower_rmem(n: Node, ctx: Ctx) -> list[Line]:
    dtype, shape = n.args
    static = tuple(ctx.static(d, "an rmem shape") for d in shape)
    numel = math.prod(static)
    if numel % ctx.threads:
        raise LowerError("lower.rmem_distribution", f"rmem tile `{n.result}` has {numel} elements, not a multiple "
                                                    f"of the CTA's {ctx.threads} threads",
                         "pick a shape whose element count divides evenly over the threads")
    layout = None
    if n.result in _frag_names(ctx):
        layout = _warp_grid(static, ctx.threads, n.result)
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), static, layout=layout)
    where = f"mma_sync fragments, {layout[0]}x{layout[1]} warps" if layout else f"over {ctx.threads} threads"
    return [f"{dtype.c_type} {n.result}[{numel // ctx.threads}];  // {static} {where}",
            f"cake::fill_rmem({n.result}, {_c_literal(n.attr('fill'), dtype)});"]


@lowering(Op.LOAD)
def _lower_load(n: Node, ctx: Ctx) -> list[Line]:
    dst_name, view = n.args
    dst = ctx.buf(dst_name, (MemSpace.SMEM, MemSpace.RMEM), "destination")
    w = _window(view, dst.shape, ctx, "source")
    guard = "true" if n.attr("guard") else "false"
    if dst.layout is not None:
        m, nn = dst.shape
        return [f"cake::load_mma_acc_gmem<{w.rows}, {w.cols}, {m}, {nn}, THREADS, {dst.layout[0]}, {dst.layout[1]}, "
                f"{guard}>({dst_name}, {w.base}, {_box_args(w)});"]
    fn = "load_smem_gmem" if dst.type.space is MemSpace.SMEM else "load_rmem_gmem"
    return [f"cake::{fn}<{w.rows}, {w.cols}, THREADS, {guard}>({dst_name}, {w.base}, {_box_args(w)});"]


@lowering(Op.STORE)
def _lower_store(n: Node, ctx: Ctx) -> list[Line]:
    view, src_name = n.args
    src = ctx.buf(src_name, (MemSpace.SMEM, MemSpace.RMEM), "source")
    w = _window(view, src.shape, ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    if src.layout is not None:
        m, nn = src.shape
        return [f"cake::store_gmem_mma_acc<{w.rows}, {w.cols}, {m}, {nn}, THREADS, {src.layout[0]}, {src.layout[1]}, "
                f"{guard}>({w.base}, {src_name}, {_box_args(w)});"]
    fn = "store_gmem_smem" if src.type.space is MemSpace.SMEM else "store_gmem_rmem"
    return [f"cake::{fn}<{w.rows}, {w.cols}, THREADS, {guard}>({w.base}, {src_name}, {_box_args(w)});"]


@lowering(Op.SYNC)
def _lower_sync(n: Node, ctx: Ctx) -> list[Line]:
    return ["__syncthreads();"]


@lowering(Op.MMA)
def _lower_mma(n: Node, ctx: Ctx) -> list[Line]:
    atom = n.attr("atom")
    if atom not in ("fma", "mma_sync"):
        raise LowerError("lower.unsupported_atom", f'mma atom "{atom}" is not lowered yet; mma lowers atom="fma" '
                                                   'and atom="mma_sync"',
                         'use atom="mma_sync" for tensor cores, or the wgmma op (sm_90a) for warpgroup MMA')
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
    if atom == "fma":
        if acc.layout is not None:
            raise LowerError("lower.acc_layout", f'`{acc_n}` is an mma_sync accumulator (fragment layout); '
                                                 'an mma with atom="fma" cannot accumulate into it',
                             "use one atom per accumulator")
        return [f"cake::mma_fma_rmem_smem<{m}, {nn}, {k}, THREADS>({acc_n}, {a_n}, {b_n});"]
    # atom == "mma_sync"
    arch = ctx.program.target
    num = re.match(r"sm_(\d+)", arch or "")
    if num is None or int(num.group(1)) < 80:
        raise LowerError("lower.unsupported_atom", f'atom="mma_sync" (m16n8k16 bf16/f16) needs sm_80 or newer, '
                                                   f"not {arch}")
    if a.type.dtype is not b.type.dtype or a.type.dtype not in (DType.BF16, DType.F16):
        raise LowerError("lower.unsupported_operand", f'atom="mma_sync" takes bf16 or f16 a and b of one dtype; '
                                                      f"a is {a.type.dtype.value}, b is {b.type.dtype.value}",
                         'allocate both smem tiles as bf16 (or f16), or use atom="fma"')
    if a.type.swizzle.value or b.type.swizzle.value:
        raise LowerError("lower.unsupported_layout", 'atom="mma_sync" reads plain row-major smem tiles; '
                                                     f"`{a_n if a.type.swizzle.value else b_n}` is swizzled",
                         "allocate the operands with swizzle=0")
    if k % 16:
        raise LowerError("lower.mma_tiling", f'atom="mma_sync" steps K by 16; K = {k} is not a multiple of 16',
                         "make the K tile (e.g. BK) a multiple of 16")
    if acc.layout is None:
        raise LowerError("lower.acc_layout", f"accumulator `{acc_n}` is not in the mma_sync fragment layout",
                         "allocate the accumulator with rmem(...) in this kernel")
    wm, wn = acc.layout
    return [f"cake::mma_sync_rmem_smem<{m}, {nn}, {k}, THREADS, {wm}, {wn}>({acc_n}, {a_n}, {b_n});"
            f"  // {wm}x{wn} warps, {m // wm}x{nn // wn} per warp"]


# ------------------------------------------------------- mma_sync fragment layout (see the module docstring)

_SLOTWISE = (Op.FILL, Op.CAST, Op.UNARY, Op.EWISE)   # lowered slot by slot when operand shapes agree


def _buf_operands(n: Node) -> list[str]:
    """Names of the smem/rmem tiles a node reads or writes (views name gmem and are left out)."""
    from cake_core.ir.ops import REGISTRY
    out = []
    for (_, kind), a in zip(REGISTRY[n.op].operands, n.args):
        if kind == "buf" and isinstance(a, str):
            out.append(a)
        elif kind == "slot" and hasattr(a, "buf"):
            out.append(a.buf)
    return out


def _frag_names(ctx: Ctx) -> frozenset[str]:
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


def _warp_grid(shape: tuple[int, ...], threads: int, name: str) -> tuple[int, int]:
    """(WM, WN) warps tiling an (M, N) mma_sync accumulator with m16n8 atoms: the grid with the fewest
    ldmatrix per warp per 16 of K (MI x4 for A, ceil(NI / 2) for B), ties to more warp rows."""
    if len(shape) != 2:
        raise LowerError("lower.shape_mismatch", f"mma_sync accumulator `{name}` has rank {len(shape)}; 2 needed")
    m, nn = shape
    warps = threads // 32
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if m % (16 * wm) or nn % (8 * wn):
            continue
        mi, ni = m // wm // 16, nn // wn // 8
        cost = (mi + (ni + 1) // 2, -wm)
        if best is None or cost < best[0]:
            best = (cost, (wm, wn))
    if best is None:
        raise LowerError("lower.mma_tiling",
                         f"mma_sync accumulator `{name}` ({m}, {nn}) cannot be tiled by the CTA's {warps} warps in "
                         "m16n8 atoms: no warp grid WM x WN = "
                         f"{warps} has M divisible by 16 * WM and N divisible by 8 * WN",
                         f"e.g. make M a multiple of {16 * warps} or N a multiple of {8 * warps}, or use fewer threads")
    return best[1]


def _layout_guard(n: Node, ctx: Ctx) -> None:
    """Refuse a node that touches a fragment-layout rmem tile unless its lowering follows that layout."""
    if n.op in (Op.RMEM, Op.MMA, Op.LOAD, Op.STORE, Op.SMEM, Op.FOR, Op.SYNC, Op.LET):
        return        # these hooks handle the layout themselves (or touch no tile)
    names = _buf_operands(n)
    frag = _frag_names(ctx)
    hit = [x for x in names if x in frag]
    if not hit:
        return
    if n.op in _SLOTWISE:
        bufs = []
        for x in names:
            try:
                bufs.append(ctx.buf(x, (MemSpace.SMEM, MemSpace.RMEM), "operand"))
            except LowerError:
                return    # the op's own hook reports it
        if all(b.layout is not None and b.shape == bufs[0].shape and b.layout == bufs[0].layout for b in bufs):
            return
    raise LowerError("lower.acc_layout",
                     f"`{hit[0]}` is an mma_sync accumulator (fragment layout: see the lowering's docstring); "
                     f"`{n.op.value}` here would address its elements in the default distribution",
                     "store it to gmem (or use fill/cast/unary/ewise with rmem operands of its shape only), "
                     'or accumulate with atom="fma"')


@lowering(Op.FOR)
def _lower_for(n: Node, ctx: Ctx) -> list[Line]:
    var = n.args[0]
    if var in ctx.loop_vars or var in ctx.consts or var in ctx.dims:
        raise LowerError("lower.shadowed_name", f"loop variable `{var}` shadows a name already in scope")
    start, stop, step = loop_range(n)
    ext = ctx.check_expr(stop, "the loop extent")
    pad = "    " * ctx.depth
    out: list[Line] = []
    unroll = n.attr("unroll")
    if unroll != 1:
        out.append(f"#pragma unroll {unroll}" if unroll > 1 else "#pragma unroll")
    if len(n.args) == 2:
        out.append(f"for (int {var} = 0; {var} < {ext}; ++{var}) {{")
    else:     # range(start, stop, step): a persistent tile loop steps by ncta.x (gridDim.x)
        first, by = ctx.check_expr(start, "the loop start"), ctx.check_expr(step, "the loop step")
        out.append(f"for (int {var} = {first}; {var} < {ext}; {var} += {by}) {{")
    body = ctx.lower_nested(n.body, loop_var=var)
    return [(n.line, pad + x) for x in out] + body + [(n.line, pad + "}")]


@lowering(Op.LET)
def _lower_let(n: Node, ctx: Ctx) -> list[Line]:
    # check_expr writes int arithmetic (consts, dims and loop variables are int; blockIdx/gridDim cast to
    # int), so the binding is exactly the int the expression would be where it is used; 64-bit offsets are
    # formed from it at the use (cake::index_t casts in the window code), as from an inline expression
    var, value = n.args
    if var in ctx.loop_vars or var in ctx.bound or var in ctx.consts or var in ctx.dims:
        raise LowerError("lower.shadowed_name", f"binding `{var}` shadows a name already in scope")
    c = ctx.check_expr(value, f"binding `{var}`")
    ctx.bound.append(var)
    return [f"const int {var} = {c};"]


# --------------------------------------------------------------------- driver

def _dims(p: Program) -> tuple[str, ...]:
    seen: list[str] = []
    for q in p.params:
        for d in q.type.shape:
            for s in _ordered_symbols(d):
                if s not in seen and s not in p.const_env:
                    seen.append(s)
    return tuple(seen)


def _ordered_symbols(e: Expr) -> list[str]:
    from cake_core.ir.expr import Bin, Call, Sym
    if isinstance(e, Sym):
        return [e.name]
    if isinstance(e, Bin):
        return _ordered_symbols(e.a) + _ordered_symbols(e.b)
    if isinstance(e, Call):
        return [s for a in e.args for s in _ordered_symbols(a)]
    return []


def _names(p: Program) -> list[tuple[str, int]]:
    out = [(p.name, p.line)] + [(q.name, q.line or p.line) for q in p.params] + [(k, p.line) for k, _ in p.consts]
    for w in walk(p.body):
        n = w[0]
        if n.result:
            out.append((n.result, n.line))
        if n.op in (Op.FOR, Op.LET):
            out.append((n.args[0], n.line))
    return out


def lower(program: Program, ir_filename: str = "kernel.cake") -> StageResult:
    """Lower a (verified) program to CUDA C++.

    Returns a ``StageResult`` of stage ``lower``: ``OK`` with a
    :class:`LoweredKernel` as ``value`` and the source as artifact ``kernel.cu``,
    or ``COMPILE_FAILED`` with every lowering diagnostic at its IR line.
    """
    dims = _dims(program)
    gmem = {q.name: Buf(q.name, q.type, ()) for q in program.params}
    ctx = Ctx(program, ir_filename, dims, gmem)
    ctx.paths = {id(w[0]): w[1] for w in walk(program.body)}
    for name, line in _names(program):
        if name in _RESERVED or name.startswith("__") or name.startswith("cake_"):
            ctx.diags.append(Diagnostic("lower.reserved_name", Severity.ERROR,
                                        f"`{name}` is reserved in the generated CUDA", line, 0, "",
                                        "rename it"))
    for g in program.grid:
        unknown = sorted(symbols(g) - set(program.const_env) - set(dims) - set(LAUNCH_SYMBOLS))
        if unknown:
            ctx.diags.append(Diagnostic("lower.unknown_name", Severity.ERROR,
                                        f"grid uses `{unknown[0]}`, which is neither a const nor a problem dimension",
                                        program.line, 0, "kernel.grid"))
    body = ctx.lower_block(program.body)
    if any(d.is_error for d in ctx.diags):
        return StageResult(STAGE, Outcome.COMPILE_FAILED, ctx.diags)

    # every op whose destination operand is a gmem view writes that parameter (store, atomics, tma_store)
    written = {w[0].arg("dst").buf for w in walk(program.body)
               if dict(REGISTRY[w[0].op].operands).get("dst") == "view"}
    args = tuple(KernelArg(q.name, q.type.dtype, q.type.shape, q.name in written) for q in program.params)
    sig = [f"{'' if a.written else 'const '}{a.dtype.c_type}* __restrict__ {a.name}" for a in args]
    sig += [f"int {d}" for d in dims]
    tmap_sig, kattrs, tmaps, cluster = lower_async.kernel_extras(ctx)
    sig += tmap_sig
    # setmaxnreg needs a register cap at entry: one CTA per SM; ctas_per_sm=N caps the registers so that N fit
    setmaxnreg = ctx.__dict__.get("async_state", {}).get("setmaxnreg")
    if setmaxnreg and program.ctas_per_sm > 1:
        return StageResult(STAGE, Outcome.COMPILE_FAILED, ctx.diags + [Diagnostic(
            "lower.ctas_per_sm", Severity.ERROR, f"ctas_per_sm={program.ctas_per_sm} with setmaxnreg roles: they need "
            "one CTA per SM", program.line, 0, "kernel", hint="drop ctas_per_sm or the roles' regs=")])
    bounds = f"{program.threads}, 1" if setmaxnreg else \
        f"{program.threads}, {program.ctas_per_sm}" if program.ctas_per_sm else f"{program.threads}"
    f = f'"{ir_filename}"'
    src = [f"// generated by cake_core.lower.cuda from {ir_filename}; program {program.name} ({program.hash})",
           f'#include "{HEADER_NAME}"', "",
           f"#line {program.line or 1} {f}",
           f"extern \"C\" __global__ void {kattrs}__launch_bounds__({bounds}) {program.name}(" + ", ".join(sig) + ") {",
           f"#line {program.line or 1} {f}",
           f"    constexpr int THREADS = {program.threads};"]
    for k, v in program.consts:
        src += [f"#line {program.line or 1} {f}", f"    constexpr int {k} = {v};"]
    if tmaps:   # the descriptors' fetch overlaps the barrier set-up instead of delaying the first copy
        src += [f"#line {program.line or 1} {f}",
                "    if (threadIdx.x == THREADS - 1) { " + " ".join(f"cake::prefetch_tensor_map(&{m.name});"
                                                             for m in tmaps) + " }"]
    if ctx.smem_top:
        src += [f"#line {program.line or 1} {f}",
                "    extern __shared__ __align__(1024) unsigned char cake_smem[];"]
    for line, text in body:
        src += [f"#line {line} {f}", text]
    src.append("}")
    source = "\n".join(src) + "\n"
    smem = -(-ctx.smem_top // SMEM_ALIGN) * SMEM_ALIGN
    lk = LoweredKernel(source, program.name, smem, program.threads, args, dims, program.grid,
                       program.consts, program.target, ir_filename, tmaps, cluster, accumulated_params(program))
    return StageResult(STAGE, Outcome.OK, ctx.diags, {"smem_bytes": smem, "source_lines": len(src)},
                       {"kernel.cu": source}, lk)

from cake_core.lower import lower_async, lower_compute, lower_control  # noqa: E402,F401  (more lowering hooks)
from cake_core.lower import lower_splitk  # noqa: E402,F401  (after lower_compute: it wraps its atomic_add)
from cake_core.lower import lower_cluster  # noqa: E402,F401  (split-K reduced over a cluster)
