"""Lowering of ``atomic_add`` from a wgmma accumulator: the split-K epilogue (header/cake_atomic.cuh).

Split-K spreads the K loop of one output tile over several CTAs (a grid dimension over K slices);
each CTA adds its partial product into an output the harness zeroes before every launch
(``Problem.zeroed_outputs``). Inside a warp role the accumulator is a wgmma fragment (lower_async),
so the v1 compute lowering of ``atomic_add``, which assumes the CTA-wide distribution (element e in
thread e % threads), would add the wrong elements: this hook takes over for such tiles and emits
``cake::atomic_add_gmem_wgmma_acc`` (red.global.add.v4.f32 when rows are 16-byte aligned, .v2 or
scalar otherwise, decided at run time from the pointer and strides). Any other ``atomic_add`` inside
a role is refused (``lower.unsupported_in_role``); outside roles the compute lowering is unchanged.
"""
from __future__ import annotations

from cake_core.ir.ops import Node, Op
from cake_core.ir.types import DType, MemSpace
from cake_core.lower.cuda import LOWERINGS, Ctx, Line, LowerError, _window, lowering
from cake_core.lower.lower_async import _role, _st

_COMPUTE_ATOMIC_ADD = LOWERINGS[Op.ATOMIC_ADD]


@lowering(Op.ATOMIC_ADD)
def _lower_atomic_add(n: Node, ctx: Ctx) -> list[Line]:
    st = _st(ctx)
    view, src = n.args
    frag = st["frag"].get(src)
    if frag is None:
        if st["role"] is not None:
            raise LowerError("lower.unsupported_in_role", f"atomic_add of `{src}` inside a role: lowered there only "
                                                          "from a wgmma accumulator",
                             "accumulate with wgmma into an rmem tile of the role, then atomic_add that tile")
        return _COMPUTE_ATOMIC_ADD(n, ctx)
    g = ctx.buf(view.buf, (MemSpace.GMEM,), "destination")
    if g.type.dtype is not DType.F32:
        raise LowerError("lower.unsupported_operand", f"atomic_add of the wgmma accumulator `{src}` into "
                                                      f"{g.type.dtype.value} `{view.buf}`: f32 gmem needed")
    w = _window(view, frag[:2], ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    first = _role(ctx)[0]
    zero = [f"if ({frag[2]}) cake::fill_rmem({src}, 0.0f);  // no wgmma wrote it"] if len(frag) > 2 else []
    return zero + [f"cake::atomic_add_gmem_wgmma_acc<{frag[1]}, {guard}>({w.base}, {src}, {w.ld_row}, {w.ld_col}, "
                   f"{w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first});"]
