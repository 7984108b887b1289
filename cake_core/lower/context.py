"""What every lowering hook shares: the lowering's products, its context (buffers in scope, diagnostics) and
gmem windows.

A hook is a function ``(node, ctx) -> lines`` (``Lowering``); ``dispatch.LOWERINGS`` holds one per op, and
``Ctx.lower_block`` runs it for each statement. A hook raises :class:`LowerError` when it cannot lower the
node, which becomes a ``COMPILE_FAILED`` diagnostic at the node's IR line; all diagnostics of a program are
collected, not just the first.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, LAUNCH_SYMBOLS, Expr, UnboundSymbol, c_expr, evaluate, symbols
from cake_core.ir.ops import At, Full, Node, Op, Tile, View
from cake_core.ir.program import Program
from cake_core.ir.smem_layout import Region, SmemLayout
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.outcome import Diagnostic, Severity
from cake_core.targets import Arch

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
    wgmma: bool = False                      # rmem a role holds in the m64nNk16 fragment layout (ir.fragments)
    rowvec: bool = False                     # rmem a role holds as a row vector of that layout (2 rows a thread)

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
    arch: Arch
    dispatch: Mapping[Op, "Lowering"]                       # one hook per op (dispatch.LOWERINGS)
    scopes: list[dict[str, Buf]] = field(default_factory=lambda: [{}])
    loop_vars: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)          # bindings (`let`) in scope, innermost last
    smem: SmemLayout | None = None                          # the one shared-memory layout (ir.smem_layout)
    smem_top: int = 0                                       # end of the smem placed so far
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

    def smem_region(self, n: Node, what: str) -> Region:
        """Where ``n``'s shared memory lies in the layout the verifier checked (``ir.smem_layout``)."""
        r = self.smem.region(n) if self.smem is not None else None
        if r is None:
            raise LowerError("lower.dynamic_shape", f"{what} has no place in shared memory: its size is not a "
                                                    "positive compile-time constant",
                             "use positive integers and consts for shapes, stages and barrier counts")
        self.smem_top = max(self.smem_top, r.end)
        return r

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
            hook = self.dispatch.get(n.op)
            try:
                if hook is None:
                    raise LowerError("lower.unknown_op", f"op `{n.op.value}` has no lowering")
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


def window(view: View, tile_shape: tuple[int, ...], ctx: Ctx, role: str) -> Window:
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
            if ix.base != 0:
                start = f"({ctx.check_expr(ix.base, 'a window base')} + {start})"
            if ix.limit is not None:       # the window ends at the limit where it comes before the edge
                dim_c = (f"min((cake::index_t){dim_c}, "
                         f"(cake::index_t)({ctx.check_expr(ix.limit, 'a window limit')}))")
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


def box_args(w: Window) -> str:
    return f"{w.ld_row}, {w.ld_col}, {w.rows_in}, {w.cols_in}"


def c_literal(v: float, dtype: DType) -> str:
    if not dtype.is_float:
        return str(int(v))
    if math.isinf(v):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return f"{float(v)!r}f"
