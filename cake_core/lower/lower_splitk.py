"""Lowering of ``atomic_add`` from a wgmma accumulator: the split-K epilogue (header/cake_atomic.cuh).

Split-K spreads the K loop of one output tile over several CTAs (a grid dimension over K slices);
each CTA adds its partial product into an output the harness zeroes before every launch
(``Problem.zeroed_outputs``). Inside a warp role the accumulator is a wgmma fragment (lower_wgmma),
so the v1 compute lowering of ``atomic_add``, which assumes the CTA-wide distribution (element e in
thread e % threads), would add the wrong elements: this hook takes over for such tiles and emits
``cake::atomic_add_gmem_wgmma_acc`` (red.global.add.v4.f32 when rows are 16-byte aligned, .v2 or
scalar otherwise, decided at run time from the pointer and strides): the ``atomic_add`` variant for a wgmma
accumulator (``lower_wgmma.reads_wgmma_acc``). Any other ``atomic_add`` inside a role is refused
(``lower.unsupported_in_role``); outside roles the compute lowering applies.
"""
from __future__ import annotations

from cake_core.ir.ops import Node
from cake_core.ir.types import DType, MemSpace
from cake_core.lower.context import Ctx, Line, LowerError, window
from cake_core.lower.lower_async import async_state, role_threads
from cake_core.lower.lower_wgmma import zero_unwritten_acc


def refuse_atomic_add_in_role(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_in_role", f"atomic_add of `{n.arg('src')}` inside a role: lowered there only "
                                                  "from a wgmma accumulator",
                     "accumulate with wgmma into an rmem tile of the role, then atomic_add that tile")


def lower_atomic_add_acc(n: Node, ctx: Ctx) -> list[Line]:
    view, src = n.args
    frag = async_state(ctx)["frag"][src]
    g = ctx.buf(view.buf, (MemSpace.GMEM,), "destination")
    if g.type.dtype is not DType.F32:
        raise LowerError("lower.unsupported_operand", f"atomic_add of the wgmma accumulator `{src}` into "
                                                      f"{g.type.dtype.value} `{view.buf}`: f32 gmem needed")
    w = window(view, frag[:2], ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    first = role_threads(ctx)[0]
    return zero_unwritten_acc(ctx, src) + [
        f"cake::atomic_add_gmem_wgmma_acc<{frag[1]}, {guard}>({w.base}, {src}, {w.ld_row}, {w.ld_col}, "
        f"{w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first});"]
