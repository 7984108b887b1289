"""The interpreter: an IR program's semantics in numpy, one CTA at a time.

Used on small shapes so that a wrong index, a missing tail guard or an
out-of-bounds access is caught on a CPU before any GPU time is spent. Tiles
are numpy arrays; bf16 values are float32 rounded to bf16 on every write to a
bf16 tile (``bf16_round``), as the hardware would store them. Semantics live
in ``SEMANTICS``, one function per op, keyed like the op registry.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from cake_core.ir.expr import evaluate
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Tile, View, loop_range
from cake_core.ir.program import Program
from cake_core.ir.types import DType


class InterpFault(Exception):
    """What a GPU would report as an illegal address or a trap, with the IR line."""

    def __init__(self, node: Node, message: str):
        super().__init__(f"line {node.line}: {message}")
        self.node, self.message = node, message


_NP = {DType.BF16: np.float32, DType.F16: np.float16, DType.F32: np.float32, DType.I32: np.int32,
       DType.I64: np.int64, DType.BOOL: np.bool_, DType.E4M3: np.float32, DType.E5M2: np.float32}


def _round(dtype: DType, x: np.ndarray) -> np.ndarray:
    if dtype is DType.BF16:
        from cake_core.problems.base import bf16_round
        return bf16_round(x)
    return x.astype(_NP[dtype])


class _CTA:
    def __init__(self, prog: Program, gmem: dict[str, np.ndarray], env: dict[str, int]):
        self.prog, self.gmem, self.env = prog, gmem, env
        self.tiles: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, DType] = {p.name: p.type.dtype for p in prog.params}

    def ev(self, e: Any) -> int:
        return int(evaluate(e, self.env))

    def window(self, n: Node, v: View) -> tuple[list[tuple[int, int, bool]], tuple[int, ...]]:
        """Per dim: (start, length, kept); and the gmem shape."""
        arr = self.gmem[v.buf]
        out = []
        for i, size in zip(v.index, arr.shape):
            if isinstance(i, Tile):
                s = self.ev(i.size)
                out.append((self.ev(i.index) * s, s, True))
            elif isinstance(i, Full):
                out.append((0, size, True))
            else:
                out.append((self.ev(i.index), 1, False))
        return out, arr.shape

    def run(self, nodes: tuple[Node, ...]) -> None:
        i = 0
        while i < len(nodes):
            if nodes[i].op is Op.ROLE:      # consecutive sibling roles run concurrently (interp_async)
                j = i
                while j < len(nodes) and nodes[j].op is Op.ROLE:
                    j += 1
                interp_async.run_roles(self, nodes[i:j])
                i = j
                continue
            SEMANTICS[nodes[i].op](self, nodes[i])
            i += 1


def _alloc(cta: _CTA, n: Node) -> None:
    shape = tuple(cta.ev(d) for d in n.args[1])
    if n.op is Op.SMEM:
        shape = (n.attr("stages"),) + shape if n.attr("stages") > 1 else shape
        # shared memory is not zeroed on the GPU: fill with NaN so reads of unwritten smem show up
        cta.tiles[n.result] = np.full(shape, np.nan, dtype=np.float64).astype(_NP[n.args[0]]) \
            if n.args[0].is_float else np.zeros(shape, _NP[n.args[0]])
    else:
        cta.tiles[n.result] = np.full(shape, n.attr("fill"), dtype=_NP[n.args[0]])
    cta.dtypes[n.result] = n.args[0]


def _clip(n: Node, v: View, win: list[tuple[int, int, bool]], shape: tuple[int, ...], guard: bool, verb: str):
    """Slices into gmem and into the tile for the in-bounds part; fault if unguarded and out of bounds."""
    g_sl, t_sl = [], []
    for (start, length, kept), size in zip(win, shape):
        lo, hi = max(start, 0), min(start + length, size)
        if (start < 0 or start + length > size) and not guard:
            raise InterpFault(n, f"out-of-bounds {verb} of `{v.buf}`: elements [{start}, {start + length}) of a "
                                 f"dimension of size {size} (unguarded {n.op.value})")
        if hi <= lo and not kept:
            raise InterpFault(n, f"index {start} out of range for a dimension of size {size} of `{v.buf}`")
        g_sl.append(slice(lo, max(hi, lo)))
        if kept:
            t_sl.append(slice(lo - start, max(hi, lo) - start))
    return tuple(g_sl), tuple(t_sl)


def _load(cta: _CTA, n: Node) -> None:
    dst, v = n.arg("dst"), n.arg("src")
    win, shape = cta.window(n, v)
    g, t = _clip(n, v, win, shape, n.attr("guard"), "read")
    tile = np.zeros(tuple(length for _, length, kept in win if kept), dtype=cta.tiles[dst].dtype)
    tile[t] = cta.gmem[v.buf][g].reshape(tile[t].shape)
    cta.tiles[dst][...] = _round(cta.dtypes[dst], tile.reshape(cta.tiles[dst].shape))


def _store(cta: _CTA, n: Node) -> None:
    v, src = n.arg("dst"), n.arg("src")
    win, shape = cta.window(n, v)
    g, t = _clip(n, v, win, shape, n.attr("guard"), "write")
    tile = cta.tiles[src].reshape(tuple(length for _, length, kept in win if kept))
    dst = cta.gmem[v.buf]
    dst[g] = _round(cta.dtypes[v.buf], tile[t]).reshape(dst[g].shape)


def _mma(cta: _CTA, n: Node) -> None:
    acc, a, b = (cta.tiles[n.arg(x)] for x in ("acc", "a", "b"))
    acc += a.astype(np.float32) @ b.astype(np.float32)


def loop_values(cta: _CTA, n: Node) -> range:
    """The values a ``for`` node's variable takes in this CTA."""
    start, stop, step = (cta.ev(x) for x in loop_range(n))
    if step < 1:
        raise InterpFault(n, f"loop step {step}: a for loop steps by a positive amount")
    return range(start, stop, step)


def _for(cta: _CTA, n: Node) -> None:
    var = n.args[0]
    for i in loop_values(cta, n):
        cta.env[var] = i
        cta.run(n.body)
    cta.env.pop(var, None)


def _if(cta: _CTA, n: Node) -> None:
    if evaluate(n.args[0], cta.env):
        cta.run(n.body)


def _let(cta: _CTA, n: Node) -> None:
    """Bind the value in the CTA's (or the role's) environment. The verifier confines uses to the
    binding's block, so the name need not be unbound at the block's end (a later trip rebinds it)."""
    cta.env[n.args[0]] = cta.ev(n.args[1])


SEMANTICS: dict[Op, Callable[[_CTA, Node], None]] = {
    Op.SMEM: _alloc,
    Op.RMEM: _alloc,
    Op.LOAD: _load,
    Op.STORE: _store,
    Op.SYNC: lambda cta, n: None,      # tile ops are collective: the barrier has no effect in one CTA
    Op.MMA: _mma,
    Op.FOR: _for,
    Op.IF: _if,
    Op.LET: _let,
}
from cake_core.ir import interp_async, interp_compute  # noqa: E402,F401  (add to SEMANTICS)

assert set(SEMANTICS) == set(REGISTRY), "every registered op needs interpreter semantics"


# The SM count the interpreter launches on (``num_sms`` in a grid): small, so that a persistent
# kernel's CTAs each walk several tiles (and an uneven share) on the small shapes checked on a CPU.
INTERP_NUM_SMS = 3


def run(program: Program, shape: dict[str, int], inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray], num_sms: int = INTERP_NUM_SMS) -> dict[str, np.ndarray]:
    """Run every CTA of the grid over ``inputs``; writes into ``outputs`` (pre-poisoned by the caller).

    ``num_sms`` is the launch symbol of that name (see ``ir.expr``). Raises InterpFault for what
    would fault on a GPU.
    """
    gmem = {**{k: np.asarray(v) for k, v in inputs.items()}, **outputs}
    for p in program.params:
        if p.name not in gmem:
            raise KeyError(f"no array for parameter `{p.name}`")
    grid = list(grid_size(program, shape, num_sms)) + [1] * (3 - len(program.grid))
    env0 = {**shape, **program.const_env, "ncta.x": grid[0], "ncta.y": grid[1], "ncta.z": grid[2]}
    cl = cluster_dims(program)
    if cl != (1, 1, 1):
        return interp_async.run_clusters(program, gmem, env0, grid, cl, outputs)
    for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        cta = _CTA(program, gmem, {**env0, "bid.x": x, "bid.y": y, "bid.z": z})
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

