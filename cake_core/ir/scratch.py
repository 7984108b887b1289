"""Shared-memory scratch of the ops that move rmem elements between threads, and of the ops that need some for
themselves (``OpDef.scratch_bytes``: ``fetch_add`` hands its value over through it, ``compact`` its warps' counts).

An operand declared with an :class:`~cake_core.ir.opdef.Exchange` (a reduction's tiles, a running merge's,
a transposed source, a scatter index, a broadcast ewise source) goes through shared memory when it is an
rmem tile: the lowering stages exactly :func:`staged_operands`, in the region of :func:`scratch_bytes` that
``ir.smem_layout`` places (and the verifier checks against the smem budget). A tile a warp role holds in the
wgmma layout (``ir.fragments``: ``held``) is never staged: its elements stay with their threads.
"""
from __future__ import annotations

from typing import Any, Callable, Container

from cake_core.ir.opdef import Exchange
from cake_core.ir.registry import REGISTRY
from cake_core.ir.types import MemSpace, TileType

SCRATCH_ALIGN = 16      # bytes between staged operands in the scratch region


def staged_operands(n: Any, types: Callable[[str], TileType | None],
                    shape: Callable[[TileType], tuple[int, ...] | None],
                    held: Container[str] = frozenset()) -> list[str]:
    """The rmem tiles that ``n`` exchanges between threads through shared-memory scratch.

    ``types`` maps a buffer name to its type, ``shape`` a type to its static shape; ``held`` names the tiles the
    roles hold in the wgmma layout, never staged.
    """
    def rmem(name: str) -> TileType | None:
        t = types(name)
        return t if t is not None and t.space is MemSpace.RMEM else None

    d = REGISTRY[n.op]
    out: list[str] = []
    dst = types(n.args[0]) if d.operands and d.operands[0].kind == "buf" else None
    for o, a in zip(d.operands, n.args):
        if o.kind != "buf" or o.exchange is Exchange.NONE or not rmem(a) or a in held:
            continue
        if o.exchange is Exchange.BROADCAST and (dst is None or shape(rmem(a)) == shape(dst)):
            continue
        out.append(a)
    return list(dict.fromkeys(out))


def own_scratch_bytes(n: Any) -> int:
    """The scratch an op uses itself (``OpDef.scratch_bytes``: a value handed from one thread to the others, the
    warps' counts of a scan), rounded up to ``SCRATCH_ALIGN``; it comes first in the op's scratch region."""
    return -(-REGISTRY[n.op].scratch_bytes // SCRATCH_ALIGN) * SCRATCH_ALIGN


def scratch_bytes(n: Any, types: Callable[[str], TileType | None],
                  shape: Callable[[TileType], tuple[int, ...] | None], held: Container[str] = frozenset()) -> int | None:
    """Bytes of shared-memory scratch ``n`` needs (None if a shape is not static): its own, then its staged
    operands."""
    total = own_scratch_bytes(n)
    for name in staged_operands(n, types, shape, held):
        t = types(name)
        s = shape(t) if t is not None else None
        if s is None:
            return None
        numel = 1
        for d in s:
            numel *= d
        total += -(-numel * t.dtype.bytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
    return total


def reduce_partials(shape: tuple[int, ...], axis: int, threads: int,
                    src_bytes: int) -> tuple[int, str, str, int, str] | None:
    """How the threads holding a CTA-spread rmem tile of ``shape`` reduce their own elements along ``axis`` before
    anything goes through shared memory: (lines each thread touches, the line of its slot ``cake_s`` as C, the
    line of its partial ``cake_k`` as C, partials per line Q, this thread's index among a line's Q as C); None
    where a thread's slots do not fall on a fixed set of lines, or where the L x Q f32/i32 partials would not fit
    the scratch the tile's staging reserves (then the lowering stages the whole tile). Element e = s * THREADS +
    tid of an (R, C) tile lies on row e / C and column e % C."""
    numel = 1
    for d in shape:
        numel *= d
    T = threads
    if T <= 0 or numel % T or len(shape) not in (1, 2):
        return None
    S = numel // T
    if len(shape) == 1:
        geo, lines = (1, "0", "0", T, "threadIdx.x"), 1
    else:
        R, C = shape
        if axis in (0, -2):                          # lines are columns
            if T % C == 0:                           # every slot of a thread on column tid % C
                geo = (1, "0", f"threadIdx.x % {C}", T // C, f"threadIdx.x / {C}")
            elif C % T == 0:                         # slot s on column (s % (C / T)) * T + tid, every row of it
                g = C // T
                geo = (g, f"cake_s % {g}", f"cake_k * {T} + threadIdx.x", 1, "0")
            else:
                return None
            lines = C
        elif C % T == 0 and S >= R:                  # lines are rows: slot s on row s / (C / T)
            geo, lines = (R, f"cake_s / {C // T}", "cake_k", T, "threadIdx.x"), R
        else:
            return None
    return geo if lines * geo[3] * 4 <= numel * src_bytes else None
