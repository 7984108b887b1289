"""The interpreter: an IR program's semantics in numpy, one CTA at a time.

Used on small shapes so that a wrong index, a missing tail guard or an out-of-bounds access is caught on a
CPU before any GPU time is spent. Each op's semantics is the function its declaration names
(``registry.SEMANTICS``); ``interp_cta`` runs blocks, warp roles and clusters.
"""
from __future__ import annotations

import itertools

import numpy as np

from cake_core.ir.expr import evaluate
from cake_core.ir.interp_cta import CTA, MAX_INTERP_STEPS, InterpFault, Work, run_clusters
from cake_core.ir.ops import Op
from cake_core.ir.program import Program
from cake_core.ir.registry import SEMANTICS
from cake_core.targets import get_arch

__all__ = ["run", "grid_size", "cluster_dims", "InterpFault", "SEMANTICS", "INTERP_NUM_SMS", "MAX_INTERP_STEPS"]

# The SM count the interpreter launches on (``num_sms`` in a grid): small, so that a persistent
# kernel's CTAs each walk several tiles (and an uneven share) on the small shapes checked on a CPU.
INTERP_NUM_SMS = 3
# The most CTAs one interpreted launch runs: the shapes checked on a CPU are small, so a grid past this is a
# grid that launches far more CTAs than the problem has tiles (a mistake), and would take hours in numpy.
MAX_INTERP_CTAS = 1 << 16


def run(program: Program, shape: dict[str, int], inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray], num_sms: int = INTERP_NUM_SMS,
        max_steps: int = MAX_INTERP_STEPS) -> dict[str, np.ndarray]:
    """Run every CTA of the grid over ``inputs``; writes into ``outputs`` (pre-poisoned by the caller).

    ``num_sms`` is the launch symbol of that name (see ``ir.expr``). Raises InterpFault for what
    would fault on a GPU, and (rule ``interp.budget``) for a launch past ``max_steps`` statements and
    loop trips over all its CTAs, at the loop with the most trips per entry.
    """
    arch = get_arch(program.target)
    gmem = {**{k: np.asarray(v) for k, v in inputs.items()}, **outputs}
    for p in program.params:
        if p.name not in gmem:
            raise KeyError(f"no array for parameter `{p.name}`")
    grid = list(grid_size(program, shape, num_sms)) + [1] * (3 - len(program.grid))
    env0 = {**shape, **program.const_env, "ncta.x": grid[0], "ncta.y": grid[1], "ncta.z": grid[2]}
    if grid[0] * grid[1] * grid[2] > MAX_INTERP_CTAS:
        raise InterpFault(program, f"the grid {' x '.join(map(str, grid))} launches "
                                   f"{grid[0] * grid[1] * grid[2]:,} CTAs on the shape {shape}: more than the "
                                   f"{MAX_INTERP_CTAS:,} the interpreter runs; size the grid by the problem's tiles "
                                   "(cdiv(dim, tile)), or min(tiles, num_sms) for a persistent kernel")
    work = Work(max_steps)
    cl = cluster_dims(program)
    if cl != (1, 1, 1):
        return run_clusters(program, gmem, env0, grid, cl, outputs, SEMANTICS, arch, work)
    for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        cta = CTA(program, gmem, {**env0, "bid.x": x, "bid.y": y, "bid.z": z}, SEMANTICS, arch, work)
        cta.run(program.body)
    return outputs


def cluster_dims(program: Program) -> tuple[int, int, int]:
    """The declared cluster shape (CTAs along x, y, z), (1, 1, 1) without one."""
    for n in program.body:
        if n.op is Op.CLUSTER:
            dims = [int(evaluate(d, program.const_env)) for d in n.args[0]]
            return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]
    return (1, 1, 1)


def grid_size(program: Program, shape: dict[str, int], num_sms: int = INTERP_NUM_SMS) -> tuple[int, ...]:
    env = {**shape, **program.const_env, "num_sms": num_sms}
    return tuple(int(evaluate(g, env)) for g in program.grid)
