"""What each op costs, by the cost class its declaration names: the walk's charges.

``HOOKS`` has one hook per ``CostClass``: tensor-core FLOPs of MMA atoms, SIMT work of compute ops, gmem
bytes of every copy, each multiplied by the trips of the loops around the op. The feature extractor
(``model.features``) walks the IR and calls the hook of each op's class, so a new op is charged by
declaring its class, and the cost models (``model.analytic``, ``model.learned``) read only features.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

from cake_core.ir.expr import UnboundSymbol, evaluate
from cake_core.ir.opdef import CostClass, Effect, Scope
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.rule_ctx import view_extent
from cake_core.targets import get_gpu


def load_gpu(name: str) -> dict:
    """The GPU's data as a mapping (the model modules index it by key); one loader: ``targets.get_gpu``."""
    return asdict(get_gpu(name))


@dataclass
class Work:
    """What one CTA does, summed over loop trips: FLOPs by the MMA atom seen, gmem bytes."""

    flops: float = 0.0
    simt_flops: float = 0.0
    bytes: float = 0.0
    atom: str = "fma"


def _numel(ctx, name: str, env: dict[str, int]) -> int:
    t = ctx.buffers.get(name)
    return math.prod(int(evaluate(d, env)) for d in t.shape) if t is not None else 0


def _name(x) -> str:
    return getattr(x, "buf", x)


def _operand(n: Node, kind: str | None = None, read_only: bool = False, writes: bool = False) -> Any:
    """The first operand of ``n`` of this kind (any kind: None) that it only reads (``read_only``) or that it
    writes (``writes``)."""
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if (kind is None or o.kind == kind) and (not read_only or o.effect_of(n) is Effect.READ) \
                and (not writes or o.effect_of(n).writes):
            return a
    raise KeyError(f"`{n.op.value}` has no such operand for its cost class {REGISTRY[n.op].cost.value}")


def _mma_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    acc, a = ctx.buffers[n.arg("acc")], ctx.buffers[_name(n.arg("a"))]
    m, nn = (int(evaluate(d, env)) for d in acc.shape)
    k = int(evaluate(a.shape[0] if n.op is Op.WGMMA and n.attr("a_major") == "m" else a.shape[-1], env))
    w.flops += 2.0 * m * nn * k * trips
    w.atom = REGISTRY[n.op].atom_of(n)


def _view_elems(ctx, v, env) -> int:
    return math.prod(int(evaluate(d, env)) for d in view_extent(ctx, v) or ())


def _copy_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """The bytes of the op's gmem window (a ``rows`` attribute: its first rows only)."""
    v = _operand(n, "view")
    ext = [int(evaluate(d, env)) for d in view_extent(ctx, v) or ()]
    if ext and "rows" in REGISTRY[n.op].attrs and n.attr("rows"):
        ext[0] = min(n.attr("rows"), ext[0])
    w.bytes += math.prod(ext) * ctx.buffers[v.buf].dtype.bytes * trips


def _gather_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """The source window's bytes, an upper bound (rows whose segment another CTA holds are not read here), and
    an add per element."""
    v = _operand(n, "view", read_only=True)
    elems = _view_elems(ctx, v, env)
    w.bytes += elems * ctx.buffers[v.buf].dtype.bytes * trips
    w.simt_flops += elems * trips


def _row_gather_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """The rows gathered (the destination tile's bytes; padding rows counted too) and their i32 indices."""
    dst = n.arg("dst")
    rows = _numel(ctx, dst, env)
    w.bytes += (rows * ctx.buffers[dst].dtype.bytes + 4 * int(evaluate(ctx.buffers[dst].shape[0], env))) * trips


def _simt_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """One SIMT op per element of the tile it writes (the first, for an op that writes a value and an index)."""
    w.simt_flops += _numel(ctx, _name(_operand(n, writes=True)), env) * trips


def _epilogue_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """A fused epilogue on an accumulator: a few SIMT ops per element of the accumulator it reads."""
    w.simt_flops += 3 * _numel(ctx, _operand(n, "buf", read_only=True), env) * trips


def _row_reduce_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """Row norms of an smem tile: a multiply-add per element of the tile it reads."""
    w.simt_flops += 2 * _numel(ctx, _name(_operand(n, read_only=True)), env) * trips


def _free(n: Node, ctx, env, trips: float, w: Work) -> None:
    """Allocation, barriers, fences, waits, smem-only exchanges: no FLOPs and no gmem bytes."""


def _bind(n: Node, ctx, env, trips: float, w: Work) -> None:
    """A binding costs nothing; its values join ``env`` (when CTA 0's are known) for the extents after it."""
    try:
        env.update(REGISTRY[n.op].bind(n, lambda e: int(evaluate(e, env))))
    except (UnboundSymbol, ZeroDivisionError, ValueError):     # unknown here, or outside the op's domain
        for name in REGISTRY[n.op].bound_names(n, Scope.BLOCK):
            env.pop(name, None)


# One hook per cost class (a test checks every class has one); an op's declaration names its class.
HOOKS: dict[CostClass, Callable[..., None]] = {
    CostClass.FREE: _free,
    CostClass.STRUCTURE: _free,      # the estimator walks the body itself
    CostClass.BIND: _bind,
    CostClass.COPY: _copy_cost,
    CostClass.MMA: _mma_cost,
    CostClass.SIMT: _simt_cost,
    CostClass.EPILOGUE: _epilogue_cost,
    CostClass.ROW_REDUCE: _row_reduce_cost,
    CostClass.GATHER: _gather_cost,
    CostClass.ROW_GATHER: _row_gather_cost,
}
