"""Lowering hooks of the compute ops (``dispatch.LOWERINGS`` names them).

Correctness first, CTA-collective outside roles:
- Elementwise ops (``fill``, ``cast``, ``unary``, ``ewise``, ``select``,
  ``iota``, ``transpose``) and ``atomic_add`` / ``scatter_add`` are emitted
  inline as one unrolled loop over the destination elements each thread owns
  (e = s * THREADS + tid: slot ``s`` of an rmem tile, element ``e`` of an smem
  tile; inside a role, over the role's threads or its wgmma fragments:
  ``thread_map``). They add no barrier:
  as with ``mma``, a ``sync()`` must separate them from smem writes of other
  threads. A ``scatter_add`` of an rmem tile into contiguous f32 gmem rows
  adds 4 columns per ``red.global.add.v4.f32`` when the view is 16-byte
  aligned at run time (``cake::scatter_add_gmem_f32x4``), else that loop.
- Ops that combine elements held by different threads (the axis ops and the
  running merges, lowered in ``lower_axis``, broadcasts and transposes of an rmem source, the scatter
  index) stage their rmem operands (``ir.scratch.staged_operands``) into
  shared-memory scratch that ``ir.smem_layout`` places, run one thread per
  line (cake_compute.cuh) and read rmem results back; they begin and end with
  ``__syncthreads()``.
Scratch is one region reused by consecutive compute statements (sized for the
largest need) and new when an smem tile was allocated after it: the layout's
rule, which the verifier checks against the target's shared memory.

Limits (LowerError): tiles of rank > 2 (``lower.unsupported_rank``), smem rings
(``lower.unsupported_operand``), scatter windows of rank > 2.
"""
from __future__ import annotations

from cake_core.ir.expr import Expr, evaluate
from cake_core.ir.ops import At, Full, Node, Op, Tile, View
from cake_core.ir.ops_compute import computes_in_float, scatter_rows_by_4
from cake_core.ir.scratch import SCRATCH_ALIGN, staged_operands
from cake_core.ir.shapes import broadcasts_to, norm_axis
from cake_core.ir.types import DType, MemSpace, Swizzle, TileType
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, Window, box_args, c_literal, window
from cake_core.lower.lower_async import async_state, in_role
from cake_core.lower.thread_map import ThreadMap, owned_loop, settle_fresh_accs, thread_map

_TILE = (MemSpace.SMEM, MemSpace.RMEM)


# ----------------------------------------------------------------- operands

def _tile(ctx: Ctx, name: str, role: str) -> Buf:
    b = ctx.buf(name, _TILE, role)
    if b.type.stages > 1:
        raise LowerError("lower.unsupported_operand", f"{role} `{name}` is a ring of {b.type.stages} stages; compute "
                                                      "ops take single-stage tiles")
    if len(b.shape) > 2:
        raise LowerError("lower.unsupported_rank", f"{role} `{name}` has rank {len(b.shape)}; compute ops lower "
                                                   "tiles of rank 1 or 2")
    return b


def _scratch(ctx: Ctx, n: Node, nbytes: int) -> int:
    """Offset of the ``nbytes`` of smem scratch statement ``n`` stages through (``ir.smem_layout`` places it)."""
    r = ctx.smem_region(n, f"the scratch of `{n.op.value}`")
    if r.nbytes != nbytes:
        raise LowerError("lower.smem_layout", f"`{n.op.value}` stages {nbytes} B of rmem operands, but the "
                                              f"shared-memory layout holds {r.nbytes} B for it",
                         "the staged operands must resolve to the same tiles as in ir.smem_layout")
    return r.offset


class _Staging:
    """The rmem operands of one statement that go through smem scratch."""

    def __init__(self, ctx: Ctx, n: Node, unstaged: frozenset[str] = frozenset()):
        """``unstaged``: operands whose scratch region is placed as usual but not filled with their elements
        (an op that writes something else there, a reduction its per-thread partials)."""
        def types(name: str) -> TileType | None:
            try:
                return ctx.buf(name, _TILE, "operand").type
            except LowerError:
                return None

        def shape(t: TileType) -> tuple[int, ...]:
            return tuple(int(evaluate(d, ctx.consts)) for d in t.shape)

        self.ctx = ctx
        self.names = staged_operands(n, types, shape, async_state(ctx)["layouts"])
        self.ptr: dict[str, str] = {}
        self.pre: list[str] = []
        if not self.names:
            return
        sizes, total = {}, 0
        for name in self.names:
            b = _tile(ctx, name, "operand")
            sizes[name] = total
            total += -(-b.numel * b.type.dtype.bytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        base = _scratch(ctx, n, total)
        self.pre.append("__syncthreads();  // scratch and inputs free to overwrite / visible")
        for name in self.names:
            b = _tile(ctx, name, "operand")
            c = b.type.dtype.c_type
            p = f"cake_st_{name}"
            self.ptr[name] = p
            self.pre.append(f"{c}* const {p} = reinterpret_cast<{c}*>(cake_smem + {base + sizes[name]});")
            if name not in unstaged:
                self.pre.append(f"cake::stage_smem_rmem<{b.numel}, THREADS>({p}, {name});")
        self.pre.append("__syncthreads();")

    def smem_ptr(self, b: Buf) -> str:
        """The smem pointer holding tile ``b`` (its scratch copy if staged)."""
        if b.name in self.ptr:
            return self.ptr[b.name]
        if b.type.space is not MemSpace.SMEM:
            raise AssertionError(f"{b.name} is rmem and not staged")
        return b.name

    def unstage(self, outs: list[Buf]) -> list[str]:
        return [f"cake::unstage_rmem_smem<{b.numel}, THREADS>({b.name}, {self.ptr[b.name]});"
                for b in outs if b.name in self.ptr]


# ----------------------------------------------------------------- elementwise loops

def _access(b: Buf, st: _Staging, offset: str | None) -> str:
    """C lvalue of the element of ``b`` at ``offset`` (None: the element this thread owns, same layout as dst)."""
    if b.rowvec:
        return f"{b.name}[cake_h]"    # a role's row vector: the row of this element (thread_map's cake_h)
    if b.type.space is MemSpace.SMEM and b.type.swizzle is not Swizzle.NONE and b.name not in st.ptr:
        return _swizzled(b, offset)
    if offset is None and b.type.space is MemSpace.RMEM and b.name not in st.ptr:
        return f"{b.name}[cake_s]"
    if offset is None:
        offset = "cake_e"
    if b.type.space is MemSpace.RMEM and b.name not in st.ptr:
        raise AssertionError(f"{b.name}: rmem read at another thread's element must be staged")
    return f"{st.smem_ptr(b)}[{offset}]"


def _swizzled(b: Buf, offset: str | None) -> str:
    """The element (cake_r, cake_c) of a swizzle-128 smem tile, where TMA and wgmma put it
    (``cake::swizzle128_elem``); the verifier's ``layout.swizzle`` admits nothing else."""
    span = 128 // b.type.dtype.bytes
    if b.type.swizzle is not Swizzle.B128 or len(b.shape) != 2 or b.shape[1] % span or offset is not None:
        raise LowerError("lower.unsupported_layout", f"`{b.name}` {b.shape} with swizzle={int(b.type.swizzle)}: "
                                                     "elementwise ops address swizzle-128 tiles of whole 128-byte "
                                                     "rows, at their own elements (no broadcast read)",
                         "allocate it with swizzle=0, or read it at a destination of its shape")
    return f"{b.name}[cake::swizzle128_elem<{b.shape[0]}, {b.shape[1]}, {b.type.dtype.c_type}>(cake_r, cake_c)]"


def _broadcast_offset(src: tuple[int, ...], dst: tuple[int, ...]) -> str | None:
    """Offset into a ``src`` tile broadcast to ``dst`` (rank ≤ 2) at (cake_r, cake_c); None if the identity."""
    if src == dst:
        return None
    idx = ("cake_r", "cake_c")[2 - len(dst):] if len(dst) <= 2 else None
    if idx is None:
        raise LowerError("lower.unsupported_rank", "compute ops lower tiles of rank 1 or 2")
    aligned = idx[len(idx) - len(src):]
    terms, stride = [], 1
    for i, d in zip(reversed(aligned), reversed(src)):
        if d > 1:
            terms.append(i if stride == 1 else f"{i} * {stride}")
        stride *= d
    return " + ".join(reversed(terms)) or "0"


def _owned_loop(ctx: Ctx, numel: int, cols: int, body: list[str], unroll: int = 0) -> list[str]:
    """The loop of a CTA-wide op over the elements e = s * THREADS + tid this thread owns (``thread_map``)."""
    return owned_loop(ThreadMap("cta", 0, ctx.threads, numel, cols), body, unroll)


def _elementwise(ctx: Ctx, n: Node, st: "_Staging", dst: Buf, tiles: list[Buf], body: list[str]) -> list[Line]:
    """An elementwise op's block: its staging, then the loop over the elements its thread map gives each thread
    (the CTA's, the role's, or the role's wgmma fragments: ``thread_map``)."""
    tm = thread_map(ctx, n, dst, tiles)
    if tm.kind != "cta" and st.names:
        raise LowerError("lower.unsupported_in_role", f"`{n.op.value}` inside a role exchanges rmem tiles through "
                                                      "smem scratch, which takes CTA barriers")
    return _block(st.pre + settle_fresh_accs(ctx, tiles), owned_loop(tm, body))


def _cta_wide(hook: Lowering) -> Lowering:
    """A hook whose lowering spreads the op over every thread of the CTA (or synchronises the CTA): refused
    inside a role, where only the role's threads run it (the verifier's ``role.compute`` says so first)."""
    def lower_cta_wide(n: Node, ctx: Ctx) -> list[Line]:
        if in_role(n, ctx):
            raise LowerError("lower.unsupported_in_role", f"`{n.op.value}` inside a role: its lowering spreads it "
                                                          "over every thread of the CTA",
                             "move it after the roles (at the top level, after a sync())")
        return hook(n, ctx)
    return lower_cta_wide


def _is_int(d: DType) -> bool:
    return not d.is_float


def _value(x: str, src: DType, float_math: bool) -> str:
    """``x`` (an element of dtype ``src``) as the compute type: f32, or int."""
    if float_math:
        return f"cake::to_f32({x})"
    return x if _is_int(src) else f"cake::f2i(cake::to_f32({x}))"


def _scale(v: float, x: str, float_math: bool) -> str:
    if v == 1:
        return x
    return f"{float(v)!r}f * {x}" if float_math else f"{int(v)} * {x}"


def _block(pre: list[str], body: list[str], post: list[str] = ()) -> list[Line]:
    return ["{"] + ["    " + x for x in list(pre) + list(body) + list(post)] + ["}"]


def lower_fill(n: Node, ctx: Ctx) -> list[Line]:
    dst = _tile(ctx, n.args[0], "destination")
    st = _Staging(ctx, n)
    lit = c_literal(n.attr("value"), dst.type.dtype)
    body = [f"{_access(dst, st, None)} = cake::convert<{dst.type.dtype.c_type}>({lit});"]
    return _elementwise(ctx, n, st, dst, [dst], body)


def _cast_expr(x: str, src: DType, dst: DType) -> str:
    if _is_int(dst) and not _is_int(src):
        return f"cake::f2i(cake::to_f32({x}))"
    return f"cake::convert<{dst.c_type}>({x})"


def lower_cast(n: Node, ctx: Ctx) -> list[Line]:
    dst, src = _tile(ctx, n.args[0], "destination"), _tile(ctx, n.args[1], "source")
    if dst.shape != src.shape:
        raise LowerError("lower.shape_mismatch", f"cast of {src.shape} into {dst.shape}")
    st = _Staging(ctx, n)
    body = [f"{_access(dst, st, None)} = {_cast_expr(_access(src, st, None), src.type.dtype, dst.type.dtype)};"]
    return _elementwise(ctx, n, st, dst, [dst, src], body)


_UNARY_F = {"neg": "(-{x})", "abs": "fabsf({x})", "square": "({x} * {x})", "sqrt": "sqrtf({x})",
            "rsqrt": "rsqrtf({x})", "exp": "expf({x})", "log": "logf({x})", "exp2": "exp2f({x})",
            "sigmoid": "cake::sigmoid_f32({x})", "silu": "cake::silu_f32({x})",
            "softplus": "cake::softplus_f32({x})"}
_UNARY_I = {"neg": "(-{x})", "abs": "abs({x})", "square": "({x} * {x})"}


def lower_unary(n: Node, ctx: Ctx) -> list[Line]:
    dst, src = _tile(ctx, n.args[0], "destination"), _tile(ctx, n.args[1], "source")
    if dst.shape != src.shape:
        raise LowerError("lower.shape_mismatch", f"unary of {src.shape} into {dst.shape}")
    fl = dst.type.dtype.is_float
    fn = n.attr("fn")
    table = _UNARY_F if fl else _UNARY_I
    if fn not in table:
        raise LowerError("lower.unsupported_operand", f'unary fn="{fn}" needs a float destination')
    st = _Staging(ctx, n)
    body = [f"const auto cake_x = {_value(_access(src, st, None), src.type.dtype, fl)};",
            f"{_access(dst, st, None)} = cake::convert<{dst.type.dtype.c_type}>({table[fn].format(x='cake_x')});"]
    return _elementwise(ctx, n, st, dst, [dst, src], body)


_COMPARE = {"lt": "({a} < {b})", "le": "({a} <= {b})", "gt": "({a} > {b})", "ge": "({a} >= {b})",
            "eq": "({a} == {b})", "ne": "({a} != {b})"}
_EWISE_F = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
            "max": "fmaxf({a}, {b})", "min": "fminf({a}, {b})", **_COMPARE}
_EWISE_I = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
            "max": "cake_max({a}, {b})", "min": "cake_min({a}, {b})", **_COMPARE}


def lower_ewise(n: Node, ctx: Ctx) -> list[Line]:
    dst = _tile(ctx, n.args[0], "destination")
    a, b = _tile(ctx, n.args[1], "operand a"), _tile(ctx, n.args[2], "operand b")
    st = _Staging(ctx, n)
    fl = computes_in_float({x.name: x.type.dtype for x in (dst, a, b)}, n)
    vals = []
    for x, k in ((a, "alpha"), (b, "beta")):
        if not broadcasts_to(x.shape, dst.shape):
            raise LowerError("lower.shape_mismatch", f"`{x.name}` {x.shape} does not broadcast to {dst.shape}")
        v = _value(_access(x, st, _broadcast_offset(x.shape, dst.shape)), x.type.dtype, fl)
        vals.append(_scale(n.attr(k), v, fl))
    expr = (_EWISE_F if fl else _EWISE_I)[n.attr("fn")].format(a="cake_a", b="cake_b")
    body = [f"const auto cake_a = {vals[0]};", f"const auto cake_b = {vals[1]};",
            f"{_access(dst, st, None)} = cake::convert<{dst.type.dtype.c_type}>({expr});"]
    return _elementwise(ctx, n, st, dst, [dst, a, b], body)


def lower_select(n: Node, ctx: Ctx) -> list[Line]:
    dst = _tile(ctx, n.args[0], "destination")
    cond, a, b = (_tile(ctx, x, r) for x, r in zip(n.args[1:], ("condition", "operand a", "operand b")))
    st = _Staging(ctx, n)
    fl = dst.type.dtype.is_float
    for x in (cond, a, b):
        if not broadcasts_to(x.shape, dst.shape):
            raise LowerError("lower.shape_mismatch", f"`{x.name}` {x.shape} does not broadcast to {dst.shape}")
    c, va, vb = (_access(x, st, _broadcast_offset(x.shape, dst.shape)) for x in (cond, a, b))
    test = f"cake::to_f32({c}) != 0.0f" if cond.type.dtype.is_float else f"{c} != 0"
    body = [f"{_access(dst, st, None)} = cake::convert<{dst.type.dtype.c_type}>({test} ? "
            f"{_value(va, a.type.dtype, fl)} : {_value(vb, b.type.dtype, fl)});"]
    return _elementwise(ctx, n, st, dst, [dst, cond, a, b], body)


def lower_iota(n: Node, ctx: Ctx) -> list[Line]:
    dst = _tile(ctx, n.args[0], "destination")
    axis = norm_axis(n.attr("axis"), len(dst.shape))
    if axis is None:
        raise LowerError("lower.shape_mismatch", f"axis={n.attr('axis')} is not an axis of `{dst.name}` {dst.shape}")
    index = "cake_c" if axis == len(dst.shape) - 1 else "cake_r"
    base = ctx.check_expr(n.arg("base"), "base")
    st = _Staging(ctx, n)
    body = [f"{_access(dst, st, None)} = cake::convert<{dst.type.dtype.c_type}>((int)({base}) + {index});"]
    return _elementwise(ctx, n, st, dst, [dst], body)


def lower_transpose(n: Node, ctx: Ctx) -> list[Line]:
    dst, src = _tile(ctx, n.args[0], "destination"), _tile(ctx, n.args[1], "source")
    if len(src.shape) != 2 or dst.shape != src.shape[::-1]:
        raise LowerError("lower.shape_mismatch", f"transpose of {src.shape} into {dst.shape}")
    if dst.name == src.name:
        raise LowerError("lower.unsupported_operand", "transpose in place races between threads")
    st = _Staging(ctx, n)
    rows = dst.shape[0]
    x = _access(src, st, f"cake_c * {rows} + cake_r")
    body = [f"{_access(dst, st, None)} = {_cast_expr(x, src.type.dtype, dst.type.dtype)};"]
    return _block(st.pre, _owned_loop(ctx, dst.numel, dst.shape[-1], body))


def lower_trisolve(n: Node, ctx: Ctx) -> list[Line]:
    x, low = _tile(ctx, n.arg("x"), "x"), _tile(ctx, n.arg("l"), "l")
    for b in (x, low):
        if b.type.space is not MemSpace.SMEM or b.type.dtype is not DType.F32:
            raise LowerError("lower.unsupported_operand", f"trisolve takes f32 smem tiles; `{b.name}` is "
                                                          f"{b.type.dtype.value} {b.type.space.value}")
    if len(x.shape) != 2 or low.shape != (x.shape[0], x.shape[0]):
        raise LowerError("lower.shape_mismatch", f"trisolve of x {x.shape} by l {low.shape}: l must be (N, N)")
    if x.name == low.name:
        raise LowerError("lower.unsupported_operand", "trisolve in place of its own l: l is read while x is written")
    rows, cols = x.shape
    unit = "true" if n.attr("unit") else "false"
    return ["__syncthreads();  // x and l written by other threads are visible",
            f"cake::trisolve_smem<{rows}, {cols}, {unit}, THREADS>({x.name}, {low.name});",
            "__syncthreads();  // x solved, visible to every thread"]


# ----------------------------------------------------------------- atomics

def _gmem_dst(ctx: Ctx, view: View) -> Buf:
    g = ctx.buf(view.buf, (MemSpace.GMEM,), "destination")
    if g.type.dtype not in (DType.F32, DType.I32):
        raise LowerError("lower.unsupported_operand", f"atomics add into f32 or i32 gmem; `{view.buf}` is "
                                                      f"{g.type.dtype.value}")
    return g


def _atomic_value(x: str, src: DType, dst: DType) -> str:
    return f"cake::to_f32({x})" if dst is DType.F32 else _value(x, src, False)


def lower_atomic_add(n: Node, ctx: Ctx) -> list[Line]:
    view, src_name = n.args
    src = _tile(ctx, src_name, "source")
    g = _gmem_dst(ctx, view)
    w = window(view, src.shape, ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    if src.layout is not None:     # an mma_sync accumulator: each slot adds at its fragment coordinate
        m, nn = src.shape
        return [f"cake::store_gmem_mma_acc<{w.rows}, {w.cols}, {m}, {nn}, THREADS, {src.layout[0]}, "
                f"{src.layout[1]}, {guard}, true>({w.base}, {src_name}, {box_args(w)});"]
    st = _Staging(ctx, n)
    c = g.type.dtype.c_type
    val = _atomic_value(_access(src, st, None), src.type.dtype, g.type.dtype)
    pre = [f"{c}* const cake_dst = {w.base};",
           f"const cake::index_t cake_ldr = {w.ld_row}, cake_ldc = {w.ld_col};",
           f"const int cake_rin = {w.rows_in}, cake_cin = {w.cols_in};"]
    body = [f"if (!{guard} || (cake_r < cake_rin && cake_c < cake_cin)) "
            f"cake::atomic_add_gmem(cake_dst + cake_r * cake_ldr + cake_c * cake_ldc, {val});"]
    smem_src = src.type.space is MemSpace.SMEM
    return _block(pre, _owned_loop(ctx, src.numel, w.cols, body, unroll=4 if smem_src else 0))


def _valid_rows(n: Node, ctx: Ctx) -> str:
    """The rows of an op's ``base``/``limit`` range (``limit - base``) as C: those its source's first rows hold."""
    return f"{ctx.check_expr(n.arg('limit'), 'limit')} - ({ctx.check_expr(n.arg('base'), 'base')})"


def _scatter_extent(ctx: Ctx, view: View, g: Buf) -> tuple[list[tuple[object, Expr]], str]:
    kept = [(ix, d) for ix, d in zip(view.index, g.type.shape) if not isinstance(ix, At)]
    if not kept or len(kept) > 2:
        raise LowerError("lower.unsupported_rank", f"scatter_add into a rank-{len(kept)} window of `{view.buf}`; "
                                                   "1 or 2 needed")
    ix, d = kept[0]
    e = (str(ctx.static(ix.size, "a tile size")) if isinstance(ix, Tile)
         else f"({ctx.check_expr(d, 'a tensor dimension')})")
    return kept, e


def lower_scatter_add(n: Node, ctx: Ctx) -> list[Line]:
    view, idx_name, src_name = n.args[:3]
    idx, src = _tile(ctx, idx_name, "index"), _tile(ctx, src_name, "source")
    if view.buf not in ctx.gmem:
        return _lower_scatter_add_smem(n, ctx, idx, src)
    g = _gmem_dst(ctx, view)
    kept, extent = _scatter_extent(ctx, view, g)
    ix0 = kept[0][0]
    e_static = ctx.static(ix0.size, "a tile size") if isinstance(ix0, Tile) else 1
    rank2 = len(kept) == 2
    if len(src.shape) != len(kept) or idx.numel != src.shape[0]:
        raise LowerError("lower.shape_mismatch", f"scatter_add of src {src.shape} with idx {idx.shape} into a "
                                                 f"rank-{len(kept)} window")
    w = window(view, (e_static, src.shape[1]) if rank2 else (e_static,), ctx, "destination")
    if src.layout is not None:
        return _scatter_add_fragment(n, ctx, w, idx, src, extent, rank2)
    st = _Staging(ctx, n)
    c = g.type.dtype.c_type
    guard = "true" if n.attr("guard") else "false"
    cols = src.shape[1] if rank2 else 1
    val = _atomic_value(_access(src, st, None), src.type.dtype, g.type.dtype)
    ld_i, in_i = (w.ld_row, w.rows_in) if rank2 else (w.ld_col, w.cols_in)
    ok = (f"(cake_i >= 0 && cake_i < {extent} && cake_i < cake_iin && cake_c < cake_cin)" if rank2 else
          f"(cake_i >= 0 && cake_i < {extent} && cake_i < cake_iin && 0 < cake_rin)")
    pre = st.pre + [
        f"{c}* const cake_dst = {w.base};",
        f"[[maybe_unused]] const cake::index_t cake_ldi = {ld_i}, cake_ldc = {w.ld_col};",
        f"[[maybe_unused]] const int cake_iin = {in_i}, cake_cin = {w.cols_in}, cake_rin = {w.rows_in};",
        f"const int cake_valid = {_valid_rows(n, ctx)};"]
    at = "cake_dst + cake_i * cake_ldi" + (" + cake_c * cake_ldc" if rank2 else "")
    body = ["if (cake_r < cake_valid) {",
            f"    const int cake_i = {st.smem_ptr(idx)}[cake_r];",
            f"    if (!{guard} || {ok}) cake::atomic_add_gmem({at}, {val});",
            "}"]
    scalar = _owned_loop(ctx, src.numel, cols, body)
    if n.attr("vector") == 1:
        return _block(pre, scalar)
    if not (rank2 and _rows_by_red_v4(ctx, g, src, st)):
        raise LowerError("lower.unsupported_layout", f"scatter_add(..., vector=4) of {src.name} {src.shape} "
                                                     f"{src.type.space.value} into {g.name}: needs an rmem source "
                                                     "with rows a multiple of 4 long, an f32 target, and threads a "
                                                     "multiple of 32 and of the row length",
                         "drop vector=4 (element atomics), or shape the source (R, C) with C % 4 == 0 and "
                         "threads % C == 0")
    rows = f"const cake::index_t cake_rows = {extent} < cake_iin ? {extent} : (cake::index_t)cake_iin;"
    call = (f"cake::scatter_add_gmem_f32x4<{src.shape[0]}, {cols}, THREADS, {guard}>(cake_dst, cake_ldi, "
            f"(int)cake_rows, cake_cin, {st.smem_ptr(idx)}, {src.name}, cake_valid);")
    # the fallback (unaligned views) stays unrolled: a rolled loop would index the rmem source at run time
    # and move it to local memory
    return _block(pre, ["if (cake::red_v4_rows_ok(cake_dst, cake_ldi, cake_ldc)) {", "    " + rows, "    " + call,
                        "} else {"] + ["    " + x for x in scalar] + ["}"])


def _scatter_add_fragment(n: Node, ctx: Ctx, w: Window, idx: Buf, src: Buf, extent: str, rank2: bool) -> list[Line]:
    """scatter_add of an mma_sync accumulator (``cake::scatter_add_gmem_mma_acc``): each slot adds at the row its
    fragment coordinate indexes; the indices are read from smem (an rmem index tile would be in another layout)."""
    if not rank2 or idx.type.space is not MemSpace.SMEM or idx.layout is not None:
        raise LowerError("lower.acc_layout", f"scatter_add of the mma_sync accumulator `{src.name}` takes a rank-2 "
                                             f"window and smem indices; `{idx.name}` is {idx.type.space.value}",
                         "write the row indices into an smem vector (iota into smem), then scatter_add")
    m, nn = src.shape
    guard = "true" if n.attr("guard") else "false"
    valid = _valid_rows(n, ctx)
    return [f"cake::scatter_add_gmem_mma_acc<{m}, {nn}, THREADS, {src.layout[0]}, {src.layout[1]}, {guard}>("
            f"{w.base}, {src.name}, {idx.name}, {w.ld_row}, {w.ld_col}, {w.rows_in}, {w.cols_in}, "
            f"(cake::index_t)({extent}), (int)({valid}));"]


def _rows_by_red_v4(ctx: Ctx, g: Buf, src: Buf, st: _Staging) -> bool:
    """Whether a rank-2 scatter_add may add its rows 4 columns per red.global.add.v4.f32 (decided at compile time;
    the pointer and strides are checked at run time, with the scalar loop as the fallback): an f32 target, an
    rmem source with rows a multiple of 4 long, each thread on one column and every slot full. smem sources
    keep the scalar loop: a warp-owned scatter-add's gmem branch spills with both paths."""
    R, C = src.shape
    return g.type.dtype is DType.F32 and src.type.space is MemSpace.RMEM and src.name not in st.ptr \
        and scatter_rows_by_4(R, C, ctx.threads, ctx.arch.warp_size)



def _lower_scatter_add_smem(n: Node, ctx: Ctx, idx: Buf, src: Buf) -> list[Line]:
    """scatter_add into a whole smem tile (privatised accumulator): shared-memory atomics, see
    ``cake::scatter_add_smem``, or with owner="warp" plain adds by the warp owning each target row
    (``cake::scatter_add_smem_owned``). No barrier is added: as for other tile ops, ``sync()`` orders the
    tile's zeroing before and its readers after."""
    view = n.args[0]
    dst = _tile(ctx, view.buf, "scatter target")
    if dst.type.space is not MemSpace.SMEM or any(not isinstance(i, Full) for i in view.index) \
            or len(view.index) != len(dst.shape):
        raise LowerError("lower.unsupported_operand", f"scatter_add into `{view.buf}`: a target in shared memory is "
                                                      f"the whole tile, `{view.buf}[{', '.join([':'] * len(dst.shape))}]`")
    if dst.type.dtype not in (DType.F32, DType.I32):
        raise LowerError("lower.unsupported_operand", f"atomics add into f32 or i32 smem; `{view.buf}` is "
                                                      f"{dst.type.dtype.value}")
    cols = dst.shape[1] if len(dst.shape) == 2 else 1
    if src.shape[1:] != dst.shape[1:] or idx.numel != src.shape[0]:
        raise LowerError("lower.shape_mismatch", f"scatter_add of src {src.shape} with idx {idx.shape} into "
                                                 f"`{view.buf}` {dst.shape}")
    st = _Staging(ctx, n)
    guard = "true" if n.attr("guard") else "false"
    src_ptr = st.smem_ptr(src) if src.type.space is MemSpace.SMEM else src.name
    valid = _valid_rows(n, ctx)
    owned = n.attr("owner") == "warp"
    if owned and src.type.space is not MemSpace.SMEM:
        raise LowerError("lower.unsupported_operand", f"owner=\"warp\" scatter_add reads its source from smem; "
                                                      f"`{src.name}` is {src.type.space.value}")
    helper = "scatter_add_smem_owned" if owned else "scatter_add_smem"
    call = (f"cake::{helper}<{src.shape[0]}, {cols}, THREADS, {guard}>({view.buf}, {dst.shape[0]}, "
            f"{st.smem_ptr(idx)}, {src_ptr}, {valid});")
    return _block(st.pre, [call])


def lower_gather_add(n: Node, ctx: Ctx) -> list[Line]:
    """gather_add: ``cake::gather_add_bucketed`` (a stable counting sort of the rows to the warps that own
    their target rows, through the queue tile; each owner keeps two batches of its rows' loads in flight). As for other tile ops,
    ``sync()`` orders the target's zeroing before and its readers after."""
    dst_v, cnt_v, idx_name, q_name = n.arg("dst"), n.arg("count"), n.arg("idx"), n.arg("queue")
    dst, cnt = _tile(ctx, dst_v.buf, "gather target"), _tile(ctx, cnt_v.buf, "gather count")
    idx, queue = _tile(ctx, idx_name, "index"), _tile(ctx, q_name, "gather queue")
    if dst.type.space is not MemSpace.SMEM or cnt.type.space is not MemSpace.SMEM or len(dst.shape) != 2 \
            or dst.type.dtype is not DType.F32 or cnt.type.dtype is not DType.I32 or cnt.numel != dst.shape[0]:
        raise LowerError("lower.unsupported_operand", f"gather_add into `{dst_v.buf}` {dst.shape} and "
                                                      f"`{cnt_v.buf}` {cnt.shape}: an (E, C) f32 and an (E,) i32 "
                                                      "smem tile are needed")
    if idx.type.space is not MemSpace.SMEM:
        raise LowerError("lower.unsupported_operand", f"gather_add reads its indices from smem; `{idx_name}` is "
                                                      f"{idx.type.space.value}")
    warps = ctx.threads // ctx.arch.warp_size
    if queue.type.space is not MemSpace.SMEM or queue.type.dtype is not DType.I32 \
            or queue.numel < idx.numel + 2 * warps * warps:
        raise LowerError("lower.unsupported_operand", f"gather_add's queue `{q_name}` {queue.shape}: an i32 smem "
                                                      f"tile of {idx.numel + 2 * warps * warps} entries is needed")
    E, C = dst.shape
    w = window(n.arg("src"), (idx.numel, C), ctx, "source")
    valid = _valid_rows(n, ctx)
    first = ctx.check_expr(n.arg("first"), "first")
    return _block([], [f"cake::gather_add_bucketed<{idx.numel}, {C}, {E}, THREADS>({dst_v.buf}, {cnt_v.buf}, "
                       f"{idx_name}, {q_name}, (int)({first}), {w.base}, {w.ld_row}, {w.ld_col}, (int)({w.rows_in}), "
                       f"(int)({w.cols_in}), (int)({valid}));"])


lower_scatter_add_cta = _cta_wide(lower_scatter_add)    # dispatch.VARIANTS: from an mma_sync accumulator or not


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.FILL: lower_fill,
    Op.CAST: lower_cast,
    Op.UNARY: lower_unary,
    Op.EWISE: lower_ewise,
    Op.SELECT: lower_select,
    Op.IOTA: lower_iota,
    Op.TRANSPOSE: _cta_wide(lower_transpose),
    Op.TRISOLVE: _cta_wide(lower_trisolve),
    Op.GATHER_ADD: _cta_wide(lower_gather_add),
}
