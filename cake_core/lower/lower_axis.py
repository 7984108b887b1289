"""Lowering hooks of the axis and running compute ops (``reduce``, ``scan``, ``argmin``/``argmax``,
``argmin_update``, ``topk_merge``) onto the one-thread-per-line helpers of ``header/cake_compute.cuh``: each runs
between two CTA barriers, its rmem operands staged through shared-memory scratch (``lower_compute._Staging``); a
reduction of an rmem tile whose threads hold whole lines' elements combines them in registers first and
exchanges only the partials (``ir.scratch.reduce_partials``)."""
from __future__ import annotations

from cake_core.ir.ops import Node, Op
from cake_core.ir.scratch import reduce_partials
from cake_core.ir.shapes import norm_axis
from cake_core.ir.types import DType, MemSpace
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError
from cake_core.lower.lower_async import in_role
from cake_core.lower.lower_compute import _Staging, _block, _cta_wide, _tile
from cake_core.lower.thread_map import settle_fresh_accs

_FN_CODE = {"sum": 0, "max": 1, "min": 2}


def _lines(n: Node, src: Buf) -> tuple[int, int, int, int]:
    """(L, N, LS, JS) of src along the op's axis."""
    axis = norm_axis(n.attr("axis"), len(src.shape))
    if axis is None:
        raise LowerError("lower.shape_mismatch", f"axis={n.attr('axis')} is not an axis of `{src.name}` {src.shape}")
    if len(src.shape) == 1:
        return 1, src.shape[0], 0, 1
    r, c = src.shape
    return (r, c, c, 1) if axis == 1 else (c, r, 1, c)


def _line_op(st: _Staging, call: str, outs: list[Buf]) -> list[Line]:
    pre = st.pre or ["__syncthreads();  // inputs written by other threads are visible"]
    post = ["__syncthreads();  // results visible to every thread"] + st.unstage(outs)
    return _block(pre, [call], post)


def _check_reduced(src: Buf, outs: list[Buf], lines: int) -> None:
    for o in outs:
        if o.numel != lines:
            raise LowerError("lower.shape_mismatch", f"`{o.name}` {o.shape} does not hold the {lines} results of "
                                                     f"reducing `{src.name}` {src.shape}")


def _reduce_partials(n: Node, ctx: Ctx, dst: Buf, src: Buf, L: int) -> list[Line] | None:
    """An rmem ``src`` reduced by its owners first, each thread combining the elements it holds on one line into a
    partial, then the Q partials of each line combined (``reduce_smem`` over an (L, Q) tile of partials): the
    scratch carries the partials (THREADS of them, or one per line and thread), not the tile. None where the
    thread map does not allow it, or the partials would not fit the region the tile's staging reserves
    (``scratch.reduce_partials``)."""
    if src.type.space is not MemSpace.RMEM or src.layout is not None or src.wgmma:
        return None
    geo = reduce_partials(src.shape, norm_axis(n.attr("axis"), len(src.shape)), ctx.threads, src.type.dtype.bytes)
    if geo is None:
        return None
    per_thread, line_of_slot, line_of_k, Q, q = geo
    st = _Staging(ctx, n, unstaged=frozenset(b.name for b in (src, dst) if b.type.space is MemSpace.RMEM))
    op, c = _FN_CODE[n.attr("fn")], src.type.dtype.c_type
    A = f"cake::acc_t<{c}>"
    slots = src.numel // ctx.threads
    body = [f"{A} cake_p[{per_thread}];",
            f"#pragma unroll",
            f"for (int cake_k = 0; cake_k < {per_thread}; ++cake_k) cake_p[cake_k] = cake::identity<{op}, {A}>();",
            f"#pragma unroll",
            f"for (int cake_s = 0; cake_s < {slots}; ++cake_s) {{",
            f"    const int cake_k = {line_of_slot};",
            f"    cake_p[cake_k] = cake::combine<{op}, {A}>(cake_p[cake_k], cake::convert<{A}>({src.name}[cake_s]));",
            f"}}",
            f"{A}* const cake_part = reinterpret_cast<{A}*>({st.smem_ptr(src)});",
            f"__syncthreads();  // the scratch free to overwrite",
            f"#pragma unroll",
            f"for (int cake_k = 0; cake_k < {per_thread}; ++cake_k) cake_part[({line_of_k}) * {Q} + {q}] = cake_p[cake_k];",
            f"__syncthreads();  // every partial visible",
            f"cake::reduce_smem<{L}, {Q}, {Q}, 1, {op}, THREADS>({st.smem_ptr(dst)}, cake_part);",
            f"__syncthreads();  // results visible to every thread"]
    return _block([x for x in st.pre if not x.startswith("__syncthreads")], body, st.unstage([dst]))


def lower_reduce(n: Node, ctx: Ctx) -> list[Line]:
    dst, src = _tile(ctx, n.args[0], "destination"), _tile(ctx, n.args[1], "source")
    if in_role(n, ctx):
        return _reduce_rows_in_role(n, ctx, dst, src)
    L, N, LS, JS = _lines(n, src)
    _check_reduced(src, [dst], L)
    partial = _reduce_partials(n, ctx, dst, src, L)
    if partial is not None:
        return partial
    st = _Staging(ctx, n)
    call = (f"cake::reduce_smem<{L}, {N}, {LS}, {JS}, {_FN_CODE[n.attr('fn')]}, THREADS>"
            f"({st.smem_ptr(dst)}, {st.smem_ptr(src)});")
    return _line_op(st, call, [dst])


def _reduce_rows_in_role(n: Node, ctx: Ctx, dst: Buf, src: Buf) -> list[Line]:
    """``reduce`` inside a role: a fragment the role holds along its columns into a row vector of the role, in
    registers and the quad's shuffles (``cake::reduce_rows_wgmma_frag``); nothing else moves elements there."""
    if not src.wgmma or not dst.rowvec or norm_axis(n.attr("axis"), 2) != 1:
        raise LowerError("lower.unsupported_in_role", f"`reduce` inside a role reduces a fragment the role holds "
                                                      f"along axis 1 into a row vector of the role; `{src.name}` "
                                                      f"into `{dst.name}` is neither",
                         "reduce at the top level, after the roles and a sync()")
    return settle_fresh_accs(ctx, [src]) + [f"cake::reduce_rows_wgmma_frag<{_FN_CODE[n.attr('fn')]}>({dst.name}, "
                                            f"{src.name});  // the thread's columns, then its quad's"]


def lower_scan(n: Node, ctx: Ctx) -> list[Line]:
    dst, src = _tile(ctx, n.args[0], "destination"), _tile(ctx, n.args[1], "source")
    if dst.shape != src.shape:
        raise LowerError("lower.shape_mismatch", f"scan of {src.shape} into {dst.shape}")
    L, N, LS, JS = _lines(n, src)
    st = _Staging(ctx, n)
    excl = "true" if n.attr("exclusive") else "false"
    call = (f"cake::scan_smem<{L}, {N}, {LS}, {JS}, {_FN_CODE[n.attr('fn')]}, {excl}, THREADS>"
            f"({st.smem_ptr(dst)}, {st.smem_ptr(src)});")
    return _line_op(st, call, [dst])


def lower_argreduce(n: Node, ctx: Ctx) -> list[Line]:
    val, idx, src = (_tile(ctx, x, r) for x, r in zip(n.args, ("value", "index", "source")))
    if idx.type.dtype is not DType.I32:
        raise LowerError("lower.unsupported_operand", f"index tile `{idx.name}` must be i32")
    L, N, LS, JS = _lines(n, src)
    _check_reduced(src, [val, idx], L)
    st = _Staging(ctx, n)
    mx = "true" if n.op is Op.ARGMAX else "false"
    call = (f"cake::argreduce_smem<{L}, {N}, {LS}, {JS}, {mx}, THREADS>"
            f"({st.smem_ptr(val)}, {st.smem_ptr(idx)}, {st.smem_ptr(src)});")
    return _line_op(st, call, [val, idx])


def _running(ctx: Ctx, n: Node) -> tuple[Buf, Buf, Buf, str, str]:
    a, b, scores = (_tile(ctx, x, r) for x, r in zip(n.args[:3], ("running values", "running indices", "scores")))
    if len(scores.shape) != 2:
        raise LowerError("lower.shape_mismatch", f"scores `{scores.name}` must be 2-D, it is {scores.shape}")
    if a.type.dtype is not DType.F32 or b.type.dtype is not DType.I32:
        raise LowerError("lower.unsupported_operand", f"`{n.op.value}` keeps f32 values and i32 indices")
    base = ctx.check_expr(n.arg("base"), "base")
    limit = ctx.check_expr(n.arg("limit"), "limit")
    return a, b, scores, base, limit


def lower_argmin_update(n: Node, ctx: Ctx) -> list[Line]:
    best, arg, scores, base, limit = _running(ctx, n)
    R, C = scores.shape
    if best.numel != R or arg.numel != R:
        raise LowerError("lower.shape_mismatch", f"best {best.shape} and arg {arg.shape} need {R} rows")
    st = _Staging(ctx, n)
    call = (f"cake::argmin_update_smem<{R}, {C}, THREADS>({st.smem_ptr(best)}, {st.smem_ptr(arg)}, "
            f"{st.smem_ptr(scores)}, {base}, {limit});")
    return _line_op(st, call, [best, arg])


def lower_topk_merge(n: Node, ctx: Ctx) -> list[Line]:
    vals, idx, scores, base, limit = _running(ctx, n)
    R, C = scores.shape
    if len(vals.shape) != 2 or vals.shape != idx.shape or vals.shape[0] != R:
        raise LowerError("lower.shape_mismatch", f"vals {vals.shape} and idx {idx.shape} must both be ({R}, k)")
    k = vals.shape[1]
    st = _Staging(ctx, n)
    call = (f"cake::topk_merge_smem<{R}, {C}, {k}, THREADS>({st.smem_ptr(vals)}, {st.smem_ptr(idx)}, "
            f"{st.smem_ptr(scores)}, {base}, {limit});")
    return _line_op(st, call, [vals, idx])


HOOKS: dict[Op, Lowering] = {
    Op.REDUCE: lower_reduce,                    # inside a role: a fragment's rows (_reduce_rows_in_role)
    Op.SCAN: _cta_wide(lower_scan),
    Op.ARGMIN: _cta_wide(lower_argreduce),
    Op.ARGMAX: _cta_wide(lower_argreduce),
    Op.ARGMIN_UPDATE: _cta_wide(lower_argmin_update),
    Op.TOPK_MERGE: _cta_wide(lower_topk_merge),
}
