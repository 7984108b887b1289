"""Lowering of the asynchronous MMAs and their accumulators, onto header/cake_async.cuh.

- ``wgmma``: per warpgroup ``m64nNk16`` (bf16/f16 → f32), a K-major swizzle-128 A (64 rows per
  warpgroup) and an N-major swizzle-128 B (N = 64, 128, 192 or 256: N / 64 swizzle atoms side by side,
  stored as 64-column blocks that the descriptor's leading byte offset steps over; a tma_load into such
  a tile issues one box per block), shared-memory descriptors, one commit group; ``wgmma_wait(n)`` →
  ``wgmma.wait_group n``. The accumulator is an rmem tile in the m64nNk16 fragment layout (``N / 2``
  floats per thread); ``store`` of it is lowered here.
- ``wgmma(..., b_major="k")``: b is an (N, 64) K-major swizzle-128 tile, described like a (rows of one
  128-byte span, 8-row groups 1024 B apart) with the instruction's transpose-b immediate 0.
- ``wgmma(..., a_major="m")``: a is a (K, M) M-major swizzle-128 tile stored, like an N-major b, as 64-column
  blocks side by side: warpgroup w reads block w (its 64 rows of the product) with an MN-major descriptor and
  the transpose-a immediate 1.
- a register A (a 16-bit fragment of the role, ``ir.fragments``): k-step k's four registers pack slots
  8k .. 8k + 7, which are the m64k16 A fragment in the accumulator's layout.
  ``accumulate=False`` sets scale-d to 0 on the first k step (acc = a @ b).
- ``argmin_bias``: on the accumulator's fragment (``cake::argmin_bias_rmem_wgmma_acc``): each thread keeps
  (best, arg) for the 2 rows it owns per warpgroup (``float best[2]; int arg[2]``) over its own columns;
  ``store`` of either tile merges the 4 lanes of each quad (shuffles) and writes one value per row.
- ``tcgen05_mma``: not lowered (``lower.unsupported_atom``) on any target yet.

The wgmma variants of ``rmem`` and ``store`` (and the argmin_bias row state's) are chosen in ``dispatch`` by
the predicates here; the role they run in and its state are ``lower_async``'s.
"""
from __future__ import annotations

from cake_core.ir.ops import Node, Op
from cake_core.ir.types import DType, MemSpace, Swizzle, TileType
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, c_literal, window
from cake_core.lower.lower_async import async_state, in_role, role_threads, slot_ptr


# --------------------------------------------------------------------- wgmma

def _wgmma_asm(n_cols: int, ab: str, scale_d: str = '"n"(1)', tnsp_b: int = 1, tnsp_a: int = 0) -> str:
    """The wgmma asm statement; ``scale_d`` is the operand of its scale-d predicate (0: D = A @ B);
    ``tnsp_b`` the transpose-b immediate (1: b is N-major, 0: K-major), ``tnsp_a`` the transpose-a one (1: a is
    M-major, 0: K-major)."""
    regs = n_cols // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(ACC[{i}])' for i in range(regs))
    return (f'asm volatile("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{regs + 2}, 0;\\n\\t'
            f'wgmma.mma_async.sync.aligned.m64n{n_cols}k16.f32.{ab}.{ab} {{{d}}}, %{regs}, %{regs + 1}, p, 1, 1, '
            f'{tnsp_a}, {tnsp_b};\\n\\t}}" : {outs} : "l"(cake_da), "l"(cake_db), {scale_d});')


def lower_wgmma(n: Node, ctx: Ctx) -> list[Line]:
    rows = _wgmma_rows(ctx)
    acc_n = n.arg("acc")
    frag = async_state(ctx)["frag"].get(acc_n)
    if frag is None:
        raise LowerError("lower.unsupported_operand", f"`{acc_n}` is not a wgmma accumulator in scope")
    reg_a = ctx.buf(n.arg("a").buf, (MemSpace.SMEM, MemSpace.RMEM), "operand a")
    if reg_a.type.space is MemSpace.RMEM:
        return _lower_wgmma_register_a(n, ctx, reg_a, frag)
    a, pa = slot_ptr(ctx, n.arg("a"), "operand a")
    b, pb = slot_ptr(ctx, n.arg("b"), "operand b")
    kmajor = n.attr("b_major") == "k"
    mmajor = n.attr("a_major") == "m"          # a is (K, M): each warpgroup's 64 columns one span-wide block
    (m, k), (bk, nn) = (a.shape[::-1] if mmajor else a.shape), (b.shape[::-1] if kmajor else b.shape)
    dt = a.type.dtype
    if dt not in (DType.BF16, DType.F16) or b.type.dtype is not dt:
        raise LowerError("lower.unsupported_operand", "wgmma is lowered for bf16/f16 operands")
    if kmajor and (b.type.swizzle != Swizzle.B128 or bk * 2 != 128 or nn % 8):
        raise LowerError("lower.unsupported_layout", "a K-major wgmma b (b_major=\"k\") is lowered as an (N, 64) "
                                                     "16-bit tile with swizzle=128 (one 128-byte span per row), "
                                                     "N a multiple of 8", "allocate b as smem(bf16, (BN, 64), "
                                                                          "swizzle=128)")
    if a.type.swizzle != Swizzle.B128 or b.type.swizzle != Swizzle.B128 or (k * 2 != 128 and not mmajor) or \
            (nn * 2 % 128 and not kmajor):
        raise LowerError("lower.unsupported_layout", "wgmma is lowered for swizzle=128 operands: a's rows one "
                                                     "128-byte swizzle span (BK = 64 for 16-bit types; an M-major "
                                                     "a: 64 columns per warpgroup), b's rows a whole number of spans "
                                                     "(BN = 64, 128, 192 or 256)",
                         "allocate a (BM, 64) and b (64, BN) with swizzle=128")
    if (m, nn) != frag[:2] or bk != k or k % 16:
        raise LowerError("lower.shape_mismatch", f"wgmma shapes: acc {frag[:2]}, a {a.shape}, b {b.shape}")
    first = role_threads(ctx)[0]
    ab = "bf16" if dt is DType.BF16 else "f16"
    fresh = frag[2] if len(frag) > 2 else None
    asm = _wgmma_asm(nn, ab, _scale_d(n, frag), 0 if kmajor else 1, 1 if mmajor else 0).replace("ACC", acc_n)
    db = _b_desc(kmajor, nn, bk)
    if mmajor:      # the warpgroup's (K, 64) block, like an N-major b: k-steps of 16 rows, 8-row groups 1024 B apart
        a_base = f"{pa} + cake_wg * {k * 64};  // M-major: the warpgroup's block of 64 columns ({k} x 64)"
        da = (f"        const uint64_t cake_da = cake::wgmma_desc(cake_a + cake_k * {16 * 64}, {k * 128}, 1024, 1);"
              "  // M-major, 128B")
    else:
        a_base = f"{pa} + cake_wg * {rows * k};  // {rows} rows per warpgroup"
        da = "        const uint64_t cake_da = cake::wgmma_desc(cake_a + cake_k * 16, 16, 1024, 1);  // K-major, 128B"
    return [
        "{",
        "    cake::wgmma_fence();",
        f"    const int cake_wg = ((int)threadIdx.x - {first}) / {ctx.arch.warpgroup_threads};",
        f"    const {dt.c_type}* const cake_a = {a_base}",
        f"    const {dt.c_type}* const cake_b = {pb};",
        "#pragma unroll",
        f"    for (int cake_k = 0; cake_k < {k // 16}; ++cake_k) {{",
        da,
        db,
        f"        {asm}",
        "    }",
        "    cake::wgmma_commit();",
        *([f"    {fresh} = 0;"] if fresh else []),
        "}",
    ]


def _scale_d(n: Node, frag: tuple) -> str:
    """The operand of wgmma's scale-d predicate: 0 on the first k step when acc's old value is dropped
    (accumulate=False) or is still the lazy zeros no wgmma wrote."""
    fresh = frag[2] if len(frag) > 2 else None
    if not n.attr("accumulate"):
        return '"r"((int)(cake_k > 0))'
    return f'"r"((int)(cake_k > 0 || !{fresh}))' if fresh else '"n"(1)'


def _b_desc(kmajor: bool, nn: int, bk: int) -> str:
    """The line that describes k-step ``cake_k`` of b (``cake_b``): K-major rows of one 128-byte span, or N-major
    64-column blocks ``bk * 128`` B apart."""
    if kmajor:      # like a: rows of 64 K-elements in one 128-byte span, 8-row groups 1024 B apart
        return (f"        const uint64_t cake_db = cake::wgmma_desc(cake_b + cake_k * 16, 16, 1024, 1);"
                f"  // K-major, 128B: {nn} rows of 64")
    return (f"        const uint64_t cake_db = cake::wgmma_desc(cake_b + cake_k * {16 * 64}, {bk * 128}, 1024, 1);"
            f"  // N-major, 128B: {nn // 64} column block(s) {bk * 128} B apart (LBO), 8-row groups 1024 B apart "
            "(SBO)")


def _lower_wgmma_register_a(n: Node, ctx: Ctx, a: Buf, frag: tuple) -> list[Line]:
    """wgmma with A in registers: a 16-bit fragment of the role in the accumulator's layout, whose slots
    8k .. 8k + 7 are k-step k's m64k16 A fragment (4 registers of two elements, ``cake::pack2_rmem``)."""
    if not a.wgmma or a.type.dtype not in (DType.BF16, DType.F16) or n.attr("a_major") == "m":
        raise LowerError("lower.unsupported_operand", f"register A `{a.name}` is not a bf16/f16 fragment of the role "
                                                      "read K-major (its own layout)")
    b, pb = slot_ptr(ctx, n.arg("b"), "operand b")
    kmajor = n.attr("b_major") == "k"
    (m, k), (bk, nn) = a.shape, (b.shape[::-1] if kmajor else b.shape)
    if b.type.dtype is not a.type.dtype:
        raise LowerError("lower.unsupported_operand", f"register A is {a.type.dtype.value}, b {b.type.dtype.value}")
    if b.type.swizzle != Swizzle.B128 or (kmajor and bk * 2 != 128) or (not kmajor and nn * 2 % 128) or nn % 8:
        raise LowerError("lower.unsupported_layout", "with a register A, b is lowered as a swizzle=128 tile: K-major "
                                                     "(N, 64), or N-major (K, N) with N a multiple of 64",
                         "allocate b as smem(bf16, (K, BN), swizzle=128)")
    if (m, nn) != frag[:2] or bk != k or k % 16:
        raise LowerError("lower.shape_mismatch", f"wgmma shapes: acc {frag[:2]}, register a {a.shape}, b {b.shape}")
    ab = "bf16" if a.type.dtype is DType.BF16 else "f16"
    regs = nn // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"({n.arg("acc")}[{i}])' for i in range(regs))
    ins = ", ".join(f'"r"(cake_ra[cake_k][{i}])' for i in range(4))
    asm = (f'asm volatile("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{regs + 5}, 0;\\n\\t'
           f'wgmma.mma_async.sync.aligned.m64n{nn}k16.f32.{ab}.{ab} {{{d}}}, '
           f'{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, {0 if kmajor else 1};'
           f'\\n\\t}}" : {outs} : {ins}, "l"(cake_db), {_scale_d(n, frag)});')
    fresh = frag[2] if len(frag) > 2 else None
    return [
        "{",
        # packed before the fence: registers defined between it and the wgmma make ptxas serialise (C7520)
        f"    uint32_t cake_ra[{k // 16}][4];",
        "#pragma unroll",
        f"    for (int cake_k = 0; cake_k < {k // 16}; ++cake_k)",
        "#pragma unroll",
        f"        for (int cake_i = 0; cake_i < 4; ++cake_i) cake_ra[cake_k][cake_i] = "
        f"cake::pack2_rmem({a.name}[cake_k * 8 + 2 * cake_i], {a.name}[cake_k * 8 + 2 * cake_i + 1]);",
        "    cake::wgmma_fence();",
        f"    const {b.type.dtype.c_type}* const cake_b = {pb};",
        "#pragma unroll",
        f"    for (int cake_k = 0; cake_k < {k // 16}; ++cake_k) {{  // register A: slots 8k .. 8k + 7 of `{a.name}`",
        _b_desc(kmajor, nn, bk),
        f"        {asm}",
        "    }",
        "    cake::wgmma_commit();",
        *([f"    {fresh} = 0;"] if fresh else []),
        "}",
    ]


def lower_wgmma_wait(n: Node, ctx: Ctx) -> list[Line]:
    return [f"cake::wgmma_wait<{ctx.static(n.args[0], 'the groups left in flight') if n.args[0] else 0}>();"]


def lower_tcgen05(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_atom", "tcgen05_mma is declared (sm_100a) but not lowered yet: tensor "
                                               "memory allocation and tcgen05.mma are missing from the header",
                     "use wgmma on sm_90a")


# ------------------------------------------------ variants of the v1 tile ops: wgmma accumulators, row state

def is_rowstate(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation, inside a role, of argmin_bias row state (best / arg)."""
    return n.result in async_state(ctx)["rowstate"] and in_role(n, ctx)


def is_wgmma_acc(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation of a wgmma accumulator."""
    return n.result in async_state(ctx)["accs"]


def stores_rowstate(n: Node, ctx: Ctx) -> bool:
    """A store of argmin_bias row state allocated in a role."""
    return n.arg("src") in async_state(ctx)["rows"]


def reads_wgmma_acc(n: Node, ctx: Ctx) -> bool:
    """A store or an atomic_add of a wgmma accumulator in scope."""
    return n.arg("src") in async_state(ctx)["frag"]


def lower_acc_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """A wgmma accumulator: the m64nN fragment of each warpgroup, N / 2 floats per thread."""
    st = async_state(ctx)
    dtype, shape = n.args
    m, nn = (ctx.static(d, "an rmem shape") for d in shape)
    first, count = role_threads(ctx)
    rows, wg = _wgmma_rows(ctx), ctx.arch.warpgroup_threads
    if dtype is not DType.F32 or m != rows * (count // wg) or count % wg:
        raise LowerError("lower.shape_mismatch", f"wgmma accumulator `{n.result}` is {dtype.value} {(m, nn)} over "
                                                 f"{count} threads; f32 with {rows} rows per warpgroup needed")
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), (m, nn), wgmma=True)
    st["frag"][n.result] = (m, nn)
    fill = n.attr("fill")
    decl = f"float {n.result}[{nn // 2}];  // wgmma accumulator ({m}, {nn}): m64n{nn} fragment per warpgroup"
    if float(fill) == 0.0:
        # zero lazily: the first wgmma into it runs with scale-d = 0 (D = A @ B), and a store that no wgmma
        # preceded zero-fills then. Zero-filling up front would put ordinary writes of the accumulator in
        # front of a wgmma pipeline that spans loop trips (wgmma_wait(1)), and ptxas then serialises
        # every wgmma (C7515).
        st["frag"][n.result] = (m, nn, _fresh(n.result))
        return [decl, f"int {_fresh(n.result)} = 1;  // {n.result} is all zeros until a wgmma writes it"]
    return [decl, f"cake::fill_rmem({n.result}, {float(fill)!r}f);"]


def is_role_fragment(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation, inside a role, of a fragment or a row vector the role holds (``ir.fragments``)."""
    held = async_state(ctx)["layouts"].get(n.result)
    return held is not None and held.kind in ("frag", "rows") and in_role(n, ctx)


def lower_fragment_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """A fragment (N / 2 elements a thread, the accumulator's layout) or a row vector (the thread's 2 rows)."""
    st = async_state(ctx)
    held = st["layouts"][n.result]
    dtype, shape = n.args
    first, count = role_threads(ctx)
    if held.rows != _wgmma_rows(ctx) * (count // ctx.arch.warpgroup_threads):
        raise LowerError("lower.shape_mismatch", f"`{n.result}` has {held.rows} rows; the role's {count} threads "
                                                 f"hold {_wgmma_rows(ctx)} rows per warpgroup")
    dims = (held.rows, held.cols)
    rows = held.kind == "rows"
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), dims, wgmma=not rows,
                                   rowvec=rows)
    if not rows:
        st["frag"][n.result] = dims           # stored like an accumulator
    lit = c_literal(n.attr("fill"), dtype)
    what = (f"row vector ({held.rows}, 1): this thread's 2 rows, as every thread of their quad holds them" if rows
            else f"fragment {dims}: m64n{held.cols} layout per warpgroup")
    return [f"{dtype.c_type} {n.result}[{2 if rows else held.cols // 2}];  // {what}",
            f"cake::fill_rmem({n.result}, {lit});"]


def _wgmma_rows(ctx: Ctx) -> int:
    """Accumulator rows per warpgroup (wgmma's M)."""
    if ctx.arch.wgmma is None:
        raise LowerError("lower.unsupported_atom", f"wgmma exists on sm_90a only, not {ctx.program.target}")
    return ctx.arch.wgmma.m


def fragment_rows(ctx: Ctx, threads: int) -> int:
    """The accumulator rows the whole warpgroups of ``threads`` threads hold (wgmma's M per warpgroup)."""
    return _wgmma_rows(ctx) * (threads // ctx.arch.warpgroup_threads)


def _fresh(acc: str) -> str:
    return f"cake_{acc}_fresh"


def lower_rowstate_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """best / arg of argmin_bias: 2 slots per thread, the fragment rows it owns (see cake_async.cuh)."""
    st = async_state(ctx)
    dtype, shape = n.args
    dims = [ctx.static(d, "an rmem shape") for d in shape]
    first, count = role_threads(ctx)
    which = st["rowstate"][n.result][0]
    rows, wg = _wgmma_rows(ctx), ctx.arch.warpgroup_threads
    if count % wg or dims not in ([rows * (count // wg)], [rows * (count // wg), 1]) or \
            dtype is not (DType.I32 if which else DType.F32):
        raise LowerError("lower.shape_mismatch", f"argmin_bias row state `{n.result}` is {dtype.value} {tuple(dims)} "
                                                 f"over {count} threads; ({rows * (count // wg)},) "
                                                 f"{'i32' if which else 'f32'} ({rows} rows per warpgroup) needed")
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), tuple(dims))
    st["rows"][n.result] = dims[0]
    c = dtype.c_type
    lit = c_literal(n.attr("fill"), dtype)
    return [f"{c} {n.result}[2];  // argmin_bias row state: this thread's 2 fragment rows (a partial of its quad)",
            f"cake::fill_rmem({n.result}, {lit});"]


def epilogue_operands(n: Node, ctx: Ctx) -> tuple[str, tuple, str]:
    """(dots, its wgmma fragment, the bias pointer) of a fused epilogue on a wgmma accumulator
    (argmin_bias, topk_bias): inside a role, dots an accumulator in scope, bias C f32 values in smem."""
    st = async_state(ctx)
    if st["role"] is None:
        raise LowerError("lower.unsupported_operand", f"{n.op.value} is lowered inside a role, on a wgmma accumulator")
    dots = n.arg("dots")
    frag = st["frag"].get(dots)
    if frag is None:
        raise LowerError("lower.unsupported_operand", f"`{dots}` is not a wgmma accumulator in scope")
    bias, pb = slot_ptr(ctx, n.arg("bias"), "bias")
    if bias.type.dtype is not DType.F32 or bias.numel != frag[1]:
        raise LowerError("lower.shape_mismatch", f"bias {bias.shape} {bias.type.dtype.value}: {frag[1]} f32 values "
                                                 "needed")
    return dots, frag, pb


def lower_argmin_bias(n: Node, ctx: Ctx) -> list[Line]:
    dots, frag, pb = epilogue_operands(n, ctx)
    for x in (n.arg("best"), n.arg("arg")):
        if x not in async_state(ctx)["rows"]:
            raise LowerError("lower.unsupported_operand", f"`{x}` is not argmin_bias row state allocated in this role")
    first = role_threads(ctx)[0]
    beta = float(n.attr("beta"))
    return [f"cake::argmin_bias_rmem_wgmma_acc<{frag[1]}>({n.arg('best')}, {n.arg('arg')}, {dots}, {pb}, "
            f"{beta!r}f, {ctx.check_expr(n.arg('base'), 'base')}, {ctx.check_expr(n.arg('limit'), 'limit')}, "
            f"(int)threadIdx.x - {first});"]


def lower_store_rowstate(n: Node, ctx: Ctx) -> list[Line]:
    st = async_state(ctx)
    view, src = n.args
    which, partner = st["rowstate"][src]
    best, arg = (src, partner) if which == 0 else (partner, src)
    if partner not in st["rows"]:
        raise LowerError("lower.unsupported_operand", f"`{partner}`, the partner of `{src}`, is not in scope")
    rows = st["rows"][src]
    w = window(view, (rows,), ctx, "destination")
    if w.rows != 1 or w.cols != rows:
        raise LowerError("lower.shape_mismatch", f"argmin_bias row state `{src}` ({rows},) stores into a 1-D window "
                                                 f"of {rows}, not {w.rows} x {w.cols}")
    n_in = f"(({w.rows_in}) > 0 ? (int)({w.cols_in}) : 0)" if n.attr("guard") else str(rows)
    first = role_threads(ctx)[0]
    return [f"cake::store_gmem_rowstate<{which}>({w.base}, {best}, {arg}, {w.ld_col}, {n_in}, "
            f"(int)threadIdx.x - {first});  // merges each row's quad"]


def stores_rowvec(n: Node, ctx: Ctx) -> bool:
    """A store of a row vector the role holds (``ir.fragments``)."""
    held = async_state(ctx)["layouts"].get(n.arg("src"))
    return held is not None and held.kind == "rows" and in_role(n, ctx)


def lower_store_rowvec(n: Node, ctx: Ctx) -> list[Line]:
    """A row vector to an (R,) or (R, 1) window: each row's value from the first lane of its quad."""
    view, src = n.args
    b = ctx.buf(src, (MemSpace.RMEM,), "source")
    rows = b.shape[0]
    w = window(view, b.shape, ctx, "destination")
    if w.rows * w.cols != rows or (w.rows != rows and w.cols != rows):
        raise LowerError("lower.shape_mismatch", f"row vector `{src}` ({rows}, 1) stores into a window of {rows} "
                                                 f"elements, not {w.rows} x {w.cols}")
    ld, n_in = (w.ld_row, w.rows_in) if w.rows == rows else (w.ld_col, w.cols_in)
    bound = f"(int)({n_in})" if n.attr("guard") else str(rows)
    first = role_threads(ctx)[0]
    return [f"cake::store_gmem_rowvec({w.base}, {src}, {ld}, {bound}, (int)threadIdx.x - {first});  "
            "// the first lane of each row's quad"]


def lower_store_acc(n: Node, ctx: Ctx) -> list[Line]:
    """A store of a wgmma accumulator from its fragments (zeros when no wgmma wrote it)."""
    view, src = n.args
    frag = async_state(ctx)["frag"][src]
    w = window(view, frag[:2], ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    first = role_threads(ctx)[0]
    return zero_unwritten_acc(ctx, src) + [
        f"cake::store_gmem_wgmma_acc<{frag[1]}, {guard}>({w.base}, {src}, {w.ld_row}, {w.ld_col}, "
        f"{w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first});"]


def zero_unwritten_acc(ctx: Ctx, acc: str) -> list[str]:
    """The line that zero-fills a lazily zeroed accumulator no wgmma wrote (none for one filled up front)."""
    frag = async_state(ctx)["frag"][acc]
    return [f"if ({frag[2]}) cake::fill_rmem({acc}, 0.0f);  // no wgmma wrote it"] if len(frag) > 2 else []


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.WGMMA: lower_wgmma,
    Op.WGMMA_WAIT: lower_wgmma_wait,
    Op.TCGEN05_MMA: lower_tcgen05,
    Op.ARGMIN_BIAS: lower_argmin_bias,
}
