"""Which outputs a program accumulates into, so which of a problem's zeroed outputs it needs zeroed.

A problem declares outputs zeroed (``Problem.zeroed_outputs``) so that split-K kernels may add partial sums
with atomics; the harness then zeroes them before every launch, inside the timed region. A program that
only stores into an output (every element once, e.g. a split-K reduced inside a cluster) gains nothing from
that launch, and a poisoned output checks it more strictly (an element it leaves unwritten fails the gate).
So an output is zeroed only if some op reads it or adds into it: anything other than the destination of a
plain write.
"""
from __future__ import annotations

from cake_core.ir.ops import Op, View
from cake_core.ir.program import Program, walk

# ops whose gmem destination ``dst`` is written with plain stores, never read
PLAIN_WRITES = (Op.STORE, Op.TMA_STORE, Op.TOPK_CLUSTER_MERGE, Op.ACC_CLUSTER_REDUCE)


def accumulated_params(program: Program) -> tuple[str, ...]:
    """The gmem parameters some op reads or accumulates into (every view but a plain write's destination)."""
    out: set[str] = set()
    for n, _, _ in walk(program.body):
        dst = n.arg("dst") if n.op in PLAIN_WRITES else None
        out |= {a.buf for a in n.args if isinstance(a, View) and a is not dst}
    return tuple(sorted(out))
