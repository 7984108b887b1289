"""Analytic cost model: ranks and filters candidates; the GPU is the ground truth.

The estimate walks the IR and asks each op's cost hook (``COSTS``, one per
registered op): tensor-core FLOPs of MMA atoms, SIMT work of compute ops, gmem
bytes of every copy, multiplied by loop trips and by the number of CTAs, so a
small tile that re-reads its operands many times is charged for it. Time is
``max(flops / (peak * eff[atom]), bytes / bandwidth)`` stretched by wave
quantisation (CTAs per SM from shared memory and threads). The efficiency
factors are per GPU and op class; calibration refits them from measurements
(``Calibration``), and a harness version may carry a refit.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from cake_core.ir.expr import evaluate, try_evaluate
from cake_core.ir.ops import Node, Op, loop_range
from cake_core.ir.program import Program
from cake_core.ir.targets import load_target
from cake_core.ir.verify import build_ctx, smem_bytes, view_extent

_GPUS = Path(__file__).resolve().parent / "gpus"
MODEL_VERSION = "analytic-1"

# Fraction of the unit's peak an op class reaches before calibration.
DEFAULT_EFF = {"fma": 0.08, "mma_sync": 0.5, "wgmma": 0.75, "tcgen05_mma": 0.75, "simt": 0.25, "bytes": 0.8}
LAUNCH_S = 4e-6


@lru_cache(maxsize=None)
def load_gpu(name: str) -> dict[str, Any]:
    path = _GPUS / f"{name.lower()}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem.upper() for p in _GPUS.glob("*.json")))
        raise KeyError(f"no data for GPU `{name}`; known: {known}")
    return json.loads(path.read_text())


def gpu_for_name(device_name: str | None) -> str:
    """Map a device name (``NVIDIA H200``) to a data file; H200 when unknown or absent."""
    if device_name:
        for p in sorted(_GPUS.glob("*.json"), key=lambda p: -len(p.stem)):
            if p.stem.upper() in device_name.upper():
                return p.stem.upper()
    return "H200"


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


def _mma_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    acc, a = ctx.buffers[n.arg("acc")], ctx.buffers[_name(n.arg("a"))]
    m, nn = (int(evaluate(d, env)) for d in acc.shape)
    k = int(evaluate(a.shape[-1], env))
    w.flops += 2.0 * m * nn * k * trips
    w.atom = n.attr("atom") if n.op is Op.MMA else n.op.value


def _view_elems(ctx, v, env) -> int:
    return math.prod(int(evaluate(d, env)) for d in view_extent(ctx, v) or ())


def _move_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    v = n.arg("src" if n.op in (Op.LOAD, Op.TMA_LOAD, Op.CP_ASYNC, Op.CP_ASYNC_BAR) else "dst")
    ext = [int(evaluate(d, env)) for d in view_extent(ctx, v) or ()]
    if ext and n.op is Op.TMA_LOAD and n.attr("rows"):      # the first rows of the box only
        ext[0] = min(n.attr("rows"), ext[0])
    w.bytes += math.prod(ext) * ctx.buffers[v.buf].dtype.bytes * trips


def _gather_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """gather_add: the source window's bytes, an upper bound (rows whose segment another CTA holds are not read
    here), and an add per element."""
    v = n.arg("src")
    elems = _view_elems(ctx, v, env)
    w.bytes += elems * ctx.buffers[v.buf].dtype.bytes * trips
    w.simt_flops += elems * trips


def _simt_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    w.simt_flops += _numel(ctx, _name(n.args[0]), env) * trips


def _epilogue_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """A fused epilogue on an accumulator: a few SIMT ops per accumulator element."""
    w.simt_flops += 3 * _numel(ctx, n.arg("dots"), env) * trips


def _sqnorm_cost(n: Node, ctx, env, trips: float, w: Work) -> None:
    """Row norms of an smem tile: a multiply-add per source element."""
    w.simt_flops += 2 * _numel(ctx, _name(n.arg("src")), env) * trips


def _free(n: Node, ctx, env, trips: float, w: Work) -> None:
    """Allocation, barriers, fences, waits: no FLOPs and no gmem bytes."""


def _bind(n: Node, ctx, env, trips: float, w: Work) -> None:
    """A binding costs nothing; its value joins ``env`` (when CTA 0's is known) for the extents after it."""
    v = try_evaluate(n.args[1], env)
    if v is None:
        env.pop(n.args[0], None)
    else:
        env[n.args[0]] = int(v)


# One cost hook per op (a test checks every registered op has one).
COSTS = {
    Op.SMEM: _free, Op.RMEM: _free, Op.SYNC: _free, Op.MBARRIER: _free, Op.EXPECT_TX: _free,
    Op.ARRIVE: _free, Op.WAIT: _free, Op.CP_ASYNC_WAIT: _free, Op.FENCE_ASYNC: _free, Op.CLUSTER: _free,
    Op.CLUSTER_SYNC: _free, Op.WGMMA_WAIT: _free,
    Op.LOAD: _move_cost, Op.STORE: _move_cost, Op.TMA_LOAD: _move_cost, Op.TMA_STORE: _move_cost,
    Op.CP_ASYNC: _move_cost, Op.CP_ASYNC_BAR: _move_cost, Op.ATOMIC_ADD: _move_cost, Op.SCATTER_ADD: _move_cost,
    Op.GATHER_ADD: _gather_cost,
    Op.MMA: _mma_cost, Op.WGMMA: _mma_cost, Op.TCGEN05_MMA: _mma_cost,
    Op.FILL: _simt_cost, Op.CAST: _simt_cost, Op.UNARY: _simt_cost, Op.EWISE: _simt_cost,
    Op.TRANSPOSE: _simt_cost, Op.REDUCE: _simt_cost, Op.SCAN: _simt_cost, Op.ARGMIN: _simt_cost,
    Op.ARGMAX: _simt_cost, Op.ARGMIN_UPDATE: _simt_cost, Op.TOPK_MERGE: _simt_cost,
    Op.ARGMIN_BIAS: _epilogue_cost, Op.TOPK_BIAS: _epilogue_cost, Op.SQNORM_ROWS: _sqnorm_cost,
    Op.TOPK_PUBLISH: _free, Op.TOPK_CLUSTER_MERGE: _free,  # once per CTA, (R, KMAX) pairs: no term worth a model
    Op.ACC_PUBLISH: _free, Op.ACC_CLUSTER_REDUCE: _move_cost,   # smem only; the output window written once
    Op.FOR: _free, Op.IF: _free, Op.ROLE: _free,   # structure: walked by the estimator itself
    Op.LET: _bind,
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
    gpu: str = "H200"
    eff: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EFF))
    version: str = MODEL_VERSION

    def estimate(self, program: Program, shape: dict[str, int]) -> Estimate:
        g = load_gpu(self.gpu)
        env = {**shape, **program.const_env, "num_sms": g["sms"]}
        grid = [int(evaluate(x, env)) for x in program.grid]
        ctas = math.prod(grid)
        # CTA 0 stands for every CTA: a persistent tile loop walks its (largest) share of the tiles
        env.update({f"ncta.{a}": v for a, v in zip("xyz", grid + [1, 1])})
        env.update({"bid.x": 0, "bid.y": 0, "bid.z": 0})
        ctx = build_ctx(program, load_target(program.target) or {})
        work = Work()

        def walk(nodes: tuple[Node, ...], trips: float) -> None:
            for n in nodes:
                if n.op is Op.FOR:
                    start, stop, step = (int(evaluate(x, env)) for x in loop_range(n))
                    walk(n.body, trips * len(range(start, stop, max(step, 1))))
                elif n.body:                       # if (assumed taken), role
                    walk(n.body, trips)
                else:
                    COSTS[n.op](n, ctx, env, trips, work)

        walk(program.body, 1.0)
        flops, nbytes, atom = work.flops, work.bytes, work.atom
        flops *= ctas
        nbytes *= ctas
        smem = smem_bytes(ctx) or 0
        target = load_target(program.target) or {}
        by_smem = (target.get("smem_per_sm_bytes", 1) // smem) if smem else 32
        by_threads = 2048 // max(program.threads, 1)
        per_sm = max(1, min(by_smem, by_threads, 32))
        waves = math.ceil(ctas / (g["sms"] * per_sm))
        fill = ctas / (waves * g["sms"] * per_sm) if ctas else 1.0
        peak = g["bf16_tensor_flops"] if atom in ("mma_sync", "wgmma", "tcgen05_mma") else g["fp32_simt_flops"]
        t_compute = flops / (peak * self.eff.get(atom, 0.05)) + \
            work.simt_flops * ctas / (g["fp32_simt_flops"] * self.eff.get("simt", 0.25))
        t_memory = nbytes / (g["hbm_bytes_per_s"] * self.eff["bytes"])
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
