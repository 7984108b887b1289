"""Cost-model features of one program at one shape: what the IR does per CTA and over the grid, and what
ptxas reported.

Per CTA (CTA 0 stands for every CTA), summed over loop trips: what ``walk.Walker`` counts (tensor-core FLOPs by
MMA atom, SIMT work, gmem bytes by copy engine, writes, atomics, smem operand traffic, barriers, bytes in flight).

Over the grid: each gmem copy's window is evaluated for every CTA at its first trip (numpy, all CTAs at
once); CTAs that read the same window share one *stream*. From the streams' distinct counts over the grid
and over the first wave comes the DRAM estimate (``dram_bytes``): a stream re-read by later waves hits L2
when what one wave touches fits in the usable L2, else it is read again per wave (linear in between).
Split-K is how many CTAs write the same output window.

Occupancy is CTAs per SM from ptxas' registers and shared memory (the IR's estimate without ptxas),
threads, and the GPU's CTA limit; a clustered grid runs as many whole clusters at once as the GPU's GPCs
hold (``Gpu.ctas_at_once``: 30 clusters of 4 on the H200 at one CTA per SM, not 33); waves and the tail
wave follow. Every field is a number or a short string: ``vector()`` is the fixed-length numeric form the
learned model reads (schema ``FEATURE_NAMES``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from cake_core.ir.expr import Bin, Call, Cmp, Expr, Sym, try_evaluate
from cake_core.ir.ops import Op
from cake_core.ir.program import Program
from cake_core.ir.verify import build_ctx, rmem_words_per_thread, smem_bytes
from cake_core.model.charges import load_gpu
from cake_core.model.walk import ENGINES, Stream, Walker, buf_name
from cake_core.targets import find_arch, get_arch, get_gpu

ATOMS = ("none", "fma", "mma_sync", "wgmma", "tcgen05_mma")
L2_USABLE = 0.5                # Hopper's L2 is two partitions; a line read from the far one is held in both
REG_ALLOC_EXTRA = 24           # registers ptxas adds to the rmem tiles' words (addresses, indices), no ptxas
SMEM_RESERVED_PER_CTA = 1024   # shared memory the driver reserves for each resident CTA (sm_80+)


@dataclass(frozen=True)
class Features:
    """What a program does at one shape on one GPU (see the module docstring)."""

    atom: str                   # ATOMS: the MMA atom with the most FLOPs ("none" without MMA)
    copy_engine: str            # ENGINES: the engine that reads the most gmem bytes
    stages: int                 # deepest ring an async copy writes into (1: no ring)
    n_roles: int
    math_roles: int             # roles (or the whole CTA) that issue MMA work
    role_regs_max: int          # setmaxnreg budgets (0 without roles)
    role_regs_min: int
    threads: int
    registers: int              # per thread: ptxas, else the IR's estimate
    spill_bytes: int
    smem_bytes: int             # per CTA: ptxas, else the IR's allocations
    from_ptxas: bool
    ctas: int
    ctas_per_sm: int            # resident CTAs per SM
    occupancy_limit: str        # smem | regs | threads | ctas: what bounds ctas_per_sm
    declared_ctas_per_sm: int   # @kernel(ctas_per_sm=N)
    warps_per_sm: int
    concurrent_ctas: int        # min(ctas, sms * ctas_per_sm), in whole clusters that fit the GPCs (Gpu.ctas_at_once)
    waves: float                # ctas / concurrent_ctas
    full_waves: int
    tail_ctas: int              # CTAs of the last, partial wave (0: none)
    cluster_size: int
    multicast: bool
    tile_m: int                 # the largest MMA accumulator of a CTA
    tile_n: int
    tile_k: int
    unroll: int                 # largest unroll of a loop
    # per CTA
    tensor_flops: float
    fma_flops: float            # MMA work done by the SIMT FMA atom
    simt_ops: float
    read_bytes_load: float
    read_bytes_cp_async: float
    read_bytes_tma: float
    write_bytes: float
    atomic_ops: float           # gmem atomic operations (a red.v4 is one)
    atomic_bytes: float
    smem_atomic_ops: float      # adds into smem with shared-memory atomics
    smem_owned_ops: float       # ... with plain adds by the warp owning the row (scatter_add owner="warp")
    smem_operand_bytes: float   # MMA operand bytes read from smem
    syncs: float                # CTA barriers executed
    copy_trips: float           # copy ops executed (issue rounds)
    inflight_bytes: float       # gmem bytes one CTA keeps in flight
    # grid
    flops: float
    l2_bytes: float             # requested gmem bytes of all CTAs (reads, writes, atomics)
    dram_bytes: float           # estimated DRAM traffic
    unique_bytes: float         # each stream once (a lower bound of the DRAM traffic)
    footprint_bytes: float      # every gmem parameter's size
    wave_bytes: float           # what the first wave touches
    split_k: int                # CTAs writing the same output window

    def vector(self) -> list[float]:
        """The numeric form (``FEATURE_NAMES`` order): sizes as log2(1 + x), categories one-hot."""
        d = asdict(self)
        out: list[float] = []
        for name in FEATURE_NAMES:
            base, _, cat = name.partition("=")
            if cat:
                out.append(float(d[base] == cat))
            elif isinstance(d[base], bool):
                out.append(float(d[base]))
            elif base in _LINEAR:
                out.append(float(d[base]))
            else:
                out.append(log_size(d[base]))
        return out


def log_size(x: float) -> float:
    """A size as the numeric form writes it: log2(1 + x)."""
    return math.log2(1.0 + max(float(x), 0.0))


_CATEGORIES = {"atom": ATOMS, "copy_engine": ENGINES, "occupancy_limit": ("smem", "regs", "threads", "ctas")}
_LINEAR = {"waves", "n_roles", "math_roles", "cluster_size", "stages", "ctas_per_sm", "declared_ctas_per_sm"}
FEATURE_NAMES: tuple[str, ...] = tuple(
    n for f in fields(Features)
    for n in ([f"{f.name}={c}" for c in _CATEGORIES[f.name]] if f.name in _CATEGORIES else [f.name]))


# ---------------------------------------------------------------- grid analysis


def _np_eval(e: Expr, env: dict[str, Any]):
    """``evaluate`` over numpy arrays (one element per CTA); raises KeyError for an unbound symbol."""
    if isinstance(e, (int, float)):
        return e
    if isinstance(e, Sym):
        return env[e.name]
    if isinstance(e, Bin):
        x, y = _np_eval(e.a, env), _np_eval(e.b, env)
        if e.op == "+":
            return x + y
        if e.op == "-":
            return x - y
        if e.op == "*":
            return x * y
        y = np.where(np.asarray(y) == 0, 1, y)      # a zero divisor only on CTAs past the data
        return x // y if e.op == "//" else x % y
    if isinstance(e, Call):
        xs = [_np_eval(x, env) for x in e.args]
        if e.fn == "cdiv":
            return -(-xs[0] // np.where(np.asarray(xs[1]) == 0, 1, xs[1]))
        return np.minimum(*xs) if e.fn == "min" else np.maximum(*xs)
    if isinstance(e, Cmp):
        raise KeyError("comparison")
    raise KeyError(repr(e))


def _distinct(s: Stream, env: dict[str, Any], ctas: int, first: int) -> tuple[int, int]:
    """(distinct windows over the grid, distinct windows among the first ``first`` CTAs)."""
    try:
        local = dict(env)
        for var, start in s.loops:
            local[var] = _np_eval(start, local)
        cols = [np.broadcast_to(np.asarray(_np_eval(i, local), dtype=np.int64), (ctas,)) for i in s.index]
    except (KeyError, TypeError, ValueError):
        return ctas, first                          # windows CTA by CTA unknown: none shared
    if not cols:
        return 1, 1
    keys = np.stack(cols, axis=1)
    return len(np.unique(keys, axis=0)), len(np.unique(keys[:first], axis=0))


def _occupancy(threads: int, regs: int, smem: int, g: dict[str, Any], target: dict[str, Any]) -> tuple[int, str]:
    limits = {
        "ctas": g["max_ctas_per_sm"],
        "threads": target.max_threads_per_sm // max(threads, 1),
        "regs": target.regs_per_sm // max(regs * threads, 1),
        "smem": target.smem_per_sm_bytes // (smem + SMEM_RESERVED_PER_CTA),
    }
    which = min(limits, key=lambda k: (limits[k], k != "smem"))
    return max(1, limits[which]), which


def extract(program: Program, shape: dict[str, int], gpu: str = "H200", resources: Any = None) -> Features:
    """The features of ``program`` at ``shape`` on ``gpu``.

    Parameters
    ----------
    program : Program
        A verified program.
    shape : dict
        One value per problem dimension.
    gpu : str
        A GPU data file's name (``model/gpus``).
    resources : cake_core.lower.compile.Resources or mapping, optional
        ptxas' report of the compiled kernel (registers, spill_bytes, smem_bytes); without it the IR's
        estimates stand in (``from_ptxas`` says which).

    Returns
    -------
    Features
    """
    g = load_gpu(gpu)
    target = find_arch(program.target) or get_arch(g["arch"])
    env: dict[str, int] = {**shape, **program.const_env, "num_sms": g["sms"]}
    grid = [int(try_evaluate(x, env) or 0) for x in program.grid] + [1, 1]
    gx, gy, gz = max(grid[0], 0), max(grid[1], 1), max(grid[2], 1)
    ctas = gx * gy * gz
    env.update({"ncta.x": gx, "ncta.y": gy, "ncta.z": gz, "bid.x": 0, "bid.y": 0, "bid.z": 0})
    ctx = build_ctx(program, target)
    w = Walker(program, ctx, dict(env))
    w.walk(program.body, 1.0)
    a = w.acc

    res = resources if resources is None or isinstance(resources, dict) else asdict(resources)
    ir_smem = smem_bytes(ctx) or 0
    if res:
        regs, spills, smem, from_ptxas = int(res["registers"]), int(res.get("spill_bytes", 0)), \
            int(res.get("smem_bytes", ir_smem)), True
    else:
        words = rmem_words_per_thread(ctx) or 0
        regs, spills, smem, from_ptxas = min(words + REG_ALLOC_EXTRA, target.max_regs_per_thread), 0, \
            ir_smem, False
    per_sm, limit = _occupancy(program.threads, regs, smem, g, target)
    cluster = next((n for n in program.body if n.op is Op.CLUSTER), None)
    cluster_size = math.prod(int(try_evaluate(d, env) or 1) for d in cluster.arg("dims")) if cluster else 1
    concurrent = max(1, min(ctas, get_gpu(gpu).ctas_at_once(cluster_size, per_sm)))
    full_waves, tail = divmod(ctas, concurrent)

    role_regs = [r.attr("regs") for r in w.roles if r.attr("regs")]
    tensor_total = sum(a.tensor.values())
    atom = max(a.tensor, key=lambda k: a.tensor[k]) if a.tensor else "none"
    reads = a.reads
    engine = max(reads, key=lambda k: reads[k]) if any(reads.values()) else "none"
    rings = [ctx.buffers[buf_name(n.arg("dst"))].stages for n, _, _ in ctx.nodes
             if n.op in (Op.TMA_LOAD, Op.CP_ASYNC, Op.CP_ASYNC_BAR) and buf_name(n.arg("dst")) in ctx.buffers]

    # grid: streams, L2 reuse, split-K
    idx = np.arange(ctas, dtype=np.int64)
    genv: dict[str, Any] = {**{k: v for k, v in env.items() if not k.startswith("bid.")},
                            "bid.x": idx % max(gx, 1), "bid.y": (idx // max(gx, 1)) % gy,
                            "bid.z": idx // (max(gx, 1) * gy)}
    footprint = {p.name: math.prod(int(try_evaluate(d, env) or 0) for d in p.type.shape) * p.type.dtype.bytes
                 for p in program.params}
    once = wave_bytes = 0.0
    split_k, l2 = 1, 0.0
    reread: list[tuple[float, float]] = []
    for s in w.streams.values():
        total, first = _distinct(s, genv, ctas, concurrent) if ctas else (0, 0)
        l2 += s.bytes * ctas
        if s.kind == "read":
            o = min(total * s.unique, footprint.get(s.buf, math.inf), s.unique * ctas)
            pw = min(max(ctas / concurrent, 1.0) * first * s.unique, s.unique * ctas)
            once += o
            reread.append((o, max(pw, o)))
            wave_bytes += first * s.unique
        else:
            o = min(total * s.bytes, footprint.get(s.buf, math.inf)) if s.kind == "atomic" else s.bytes * ctas
            once += o
            reread.append((o, o))
            if total:
                split_k = max(split_k, round(ctas / total))
    miss = min(max(wave_bytes / (L2_USABLE * g["l2_bytes"]) - 1.0, 0.0), 1.0)
    dram = sum(o + (pw - o) * miss for o, pw in reread)

    return Features(
        atom=atom, copy_engine=engine, stages=max(rings, default=1), n_roles=len(w.roles),
        math_roles=max(len(w.math_roles), 1 if tensor_total else 0),
        role_regs_max=max(role_regs, default=0), role_regs_min=min(role_regs, default=0),
        threads=program.threads, registers=regs, spill_bytes=spills, smem_bytes=smem, from_ptxas=from_ptxas,
        ctas=ctas, ctas_per_sm=per_sm, occupancy_limit=limit, declared_ctas_per_sm=program.ctas_per_sm,
        warps_per_sm=per_sm * program.threads // 32, concurrent_ctas=concurrent,
        waves=ctas / concurrent if ctas else 0.0, full_waves=full_waves, tail_ctas=tail,
        cluster_size=cluster_size, multicast=a.multicast, tile_m=a.tile[0], tile_n=a.tile[1], tile_k=a.tile[2],
        unroll=w.max_unroll,
        tensor_flops=sum(v for k, v in a.tensor.items() if k != "fma"), fma_flops=a.tensor.get("fma", 0.0),
        simt_ops=a.simt, read_bytes_load=reads["load"], read_bytes_cp_async=reads["cp_async"],
        read_bytes_tma=reads["tma"], write_bytes=a.write, atomic_ops=a.atomic_ops, atomic_bytes=a.atomic_bytes,
        smem_atomic_ops=a.smem_atomic_ops, smem_owned_ops=a.smem_owned_ops, smem_operand_bytes=a.smem_operand, syncs=a.syncs,
        copy_trips=a.copy_trips, inflight_bytes=w.inflight_bytes(),
        flops=tensor_total * ctas, l2_bytes=l2, dram_bytes=dram, unique_bytes=once,
        footprint_bytes=float(sum(footprint.values())), wave_bytes=wave_bytes, split_k=split_k)
