"""Analytic cost model: ranks and filters candidates; the GPU is the ground truth.

The estimate walks the IR and charges each op by the cost class its declaration names (``HOOKS``, one per
``CostClass``): tensor-core FLOPs of MMA atoms, SIMT work of compute ops, gmem bytes of every copy,
multiplied by loop trips and by the number of CTAs, so a small tile that re-reads its operands many times
is charged for it. Time is ``max(flops / (peak * eff[atom]), bytes / bandwidth)`` stretched by wave
quantisation (CTAs per SM from shared memory, threads and the SM's CTA limit, all from the target data).
The efficiency factors are per GPU and op class; calibration refits them from measurements
(``Calibration``), and a harness version may carry a refit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from cake_core.ir.expr import UnboundSymbol, evaluate
from cake_core.ir.opdef import CostClass, Effect, Scope
from cake_core.ir.ops import REGISTRY, Node, Op, loop_range
from cake_core.ir.program import Program
from cake_core.ir.rule_ctx import build_ctx, smem_bytes, view_extent
from dataclasses import asdict

from cake_core.targets import DEFAULT_GPU, Gpu, find_arch, get_gpu

MODEL_VERSION = "analytic-1"

# Fraction of the unit's peak an op class reaches before calibration (keyed by the atoms of the MMA ops'
# declarations, as features() reports them, and by "simt" and "bytes").
DEFAULT_EFF = {"fma": 0.08, "mma_sync": 0.5, "wgmma": 0.75, "tcgen05": 0.75, "simt": 0.25, "bytes": 0.8}
LAUNCH_S = 4e-6


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


def _operand(n: Node, kind: str | None = None, read_only: bool = False) -> Any:
    """The first operand of ``n`` of this kind (any kind: None) that it only reads (``read_only``)."""
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if (kind is None or o.kind == kind) and (not read_only or o.effect_of(n) is Effect.READ):
            return a
    raise KeyError(f"`{n.op.value}` has no such operand for its cost class {REGISTRY[n.op].cost.value}")


def _mma_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    acc, a = ctx.buffers[n.arg("acc")], ctx.buffers[_name(n.arg("a"))]
    m, nn = (int(evaluate(d, env)) for d in acc.shape)
    k = int(evaluate(a.shape[-1], env))
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


def _simt_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    w.simt_flops += _numel(ctx, _name(n.args[0]), env) * trips


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
}


@dataclass
class Estimate:
    ms: float
    flops: float
    bytes: float
    ctas: int
    ctas_per_sm: int
    bound: str          # "compute" | "memory"


@dataclass
class CostModel:
    gpu: str = DEFAULT_GPU
    eff: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EFF))
    version: str = MODEL_VERSION

    def estimate(self, program: Program, shape: dict[str, int]) -> Estimate:
        g: Gpu = get_gpu(self.gpu)
        # the program's target when there is data for it, else the limits of the GPU it is estimated on
        arch = find_arch(program.target) or g.arch_data
        env = {**shape, **program.const_env, "num_sms": g.sms}
        grid = [int(evaluate(x, env)) for x in program.grid]
        ctas = math.prod(grid)
        # CTA 0 stands for every CTA: a persistent tile loop walks its (largest) share of the tiles
        env.update({f"ncta.{a}": v for a, v in zip("xyz", grid + [1, 1])})
        env.update({"bid.x": 0, "bid.y": 0, "bid.z": 0})
        ctx = build_ctx(program, arch)
        work = Work()

        def walk(nodes: tuple[Node, ...], trips: float) -> None:
            for n in nodes:
                if n.op is Op.FOR:
                    start, stop, step = (int(evaluate(x, env)) for x in loop_range(n))
                    env[n.args[0]] = start          # an inner extent may use the loop variable: its first trip
                    walk(n.body, trips * len(range(start, stop, max(step, 1))))
                    env.pop(n.args[0], None)
                elif n.body:                       # if (assumed taken), role
                    walk(n.body, trips)
                else:
                    HOOKS[REGISTRY[n.op].cost](n, ctx, env, trips, work)

        walk(program.body, 1.0)
        flops, nbytes, atom = work.flops, work.bytes, work.atom
        flops *= ctas
        nbytes *= ctas
        smem = smem_bytes(ctx) or 0
        by_smem = (arch.smem_per_sm_bytes // smem) if smem else arch.max_ctas_per_sm
        by_threads = arch.max_threads_per_sm // max(program.threads, 1)
        per_sm = max(1, min(by_smem, by_threads, arch.max_ctas_per_sm))
        waves = math.ceil(ctas / (g.sms * per_sm))
        fill = ctas / (waves * g.sms * per_sm) if ctas else 1.0
        peak = g.fp32_simt_flops if atom == "fma" else g.bf16_tensor_flops     # every other atom: tensor cores
        t_compute = flops / (peak * self.eff.get(atom, 0.05)) + \
            work.simt_flops * ctas / (g.fp32_simt_flops * self.eff.get("simt", 0.25))
        t_memory = nbytes / (g.hbm_bytes_per_s * self.eff["bytes"])
        t = max(t_compute, t_memory) / max(fill, 1e-3) + LAUNCH_S
        return Estimate(t * 1e3, flops, nbytes, ctas, per_sm, "compute" if t_compute >= t_memory else "memory")

    def predict_ms(self, program: Program, shapes: list[dict[str, int]]) -> list[float]:
        return [self.estimate(program, s).ms for s in shapes]


def calibrate(model: CostModel, samples: list[tuple[float, float, str]]) -> CostModel:
    """Refit per-atom efficiency from (predicted_ms, measured_ms, atom) samples: scale each
    atom's factor by the geometric mean of predicted/measured (a log-space least squares fit)."""
    eff = dict(model.eff)
    by_atom: dict[str, list[float]] = {}
    for pred, meas, atom in samples:
        if pred > 0 and meas > 0:
            by_atom.setdefault(atom, []).append(math.log(pred / meas))
    for atom, logs in by_atom.items():
        eff[atom] = min(1.0, eff.get(atom, 0.05) * math.exp(sum(logs) / len(logs)))
    return CostModel(model.gpu, eff, f"{MODEL_VERSION}+cal{len(samples)}")
