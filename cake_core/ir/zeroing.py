"""Which outputs a program accumulates into, so which of a problem's zeroed outputs it needs zeroed.

A problem declares outputs zeroed (``Problem.zeroed_outputs``) so that split-K kernels may add partial sums
with atomics; the harness then zeroes them before every launch, inside the timed region. A program that
only stores into an output (every element once, e.g. a split-K reduced inside a cluster) gains nothing from
that launch, and a poisoned output checks it more strictly (an element it leaves unwritten fails the gate).
So an output is zeroed only if some op reads it or adds into it: every view operand whose declared effect is
not a plain write.
"""
from __future__ import annotations

from cake_core.ir.ops import Effect, REGISTRY
from cake_core.ir.program import Program, walk


def accumulated_params(program: Program) -> tuple[str, ...]:
    """The gmem parameters some op reads or accumulates into (every view but a plain write's)."""
    out: set[str] = set()
    for n, _, _ in walk(program.body):
        out |= {a.buf for o, a in zip(REGISTRY[n.op].operands, n.args)
                if o.kind == "view" and o.effect_of(n) is not Effect.WRITE}
    return tuple(sorted(out))
