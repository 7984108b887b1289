"""Lowering hooks of the structured control ops other than `for` (see cuda.py): `if`."""
from __future__ import annotations

from cake_core.ir.ops import Node, Op
from cake_core.lower.cuda import Ctx, Line, lowering


@lowering(Op.IF)
def _lower_if(n: Node, ctx: Ctx) -> list[Line]:
    # the condition sees only consts, dims, loop variables and bid: uniform across the CTA, so
    # collective tile ops and __syncthreads() inside the body stay safe
    cond = ctx.check_expr(n.args[0], "the condition")
    pad = "    " * ctx.depth
    body = ctx.lower_nested(n.body)
    return [(n.line, f"{pad}if {cond} {{")] + body + [(n.line, pad + "}")]
