"""Register tiles a warp role holds in the wgmma fragment layout: accumulators, other fragments, row vectors.

Inside a role of whole warpgroups (R = 64 rows per warpgroup, wgmma's M), an rmem tile allocated in the role
has one of these layouts; each thread keeps its own elements, and the role's threads together hold the whole
tile:

- ``acc``: a wgmma accumulator (the tile an async MMA accumulates into), (R, N) f32 in the m64nNk16 fragment
  layout, N / 2 values per thread;
- ``frag``: any other (R, N) tile of the role, N a multiple of 8, of any dtype, in the same layout: the
  probabilities of an attention kernel cast to bf16 (a register A of the next wgmma, whose m64k16 A fragment
  is the accumulator's layout read 16 columns at a time), a mask, a copy of scores;
- ``rows``: an (R, 1) f32 or i32 tile of the role: one value per accumulator row, held by each of the 4 threads
  of the quad that holds the row (2 values per thread: rows r and r + 8 of its warp's 16): a running max, a
  row sum.

Elementwise ops between these run in place on each thread's own elements (a row vector broadcast along a
fragment's columns, an smem tile read at the element's row and column); ``reduce`` along a fragment's columns
into a row vector adds the thread's own columns and then the quad's (two shuffles). The row state of a fused
epilogue (argmin_bias's best / arg, topk_bias's lists) has a layout of its own and is none of these.

The verifier (``rules_async``'s ``role.compute``, ``rules_wgmma``'s ``wgmma.operands``, ``resources.rmem_split``),
the scratch layout and the lowering (``lower.thread_map``, ``lower.lower_wgmma``) read the layouts from
:func:`layouts_on`.
"""
from __future__ import annotations

from dataclasses import dataclass

from cake_core.ir.expr import evaluate
from cake_core.ir.opdef import Completion, Effect, Family
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.program import Program
from cake_core.ir.registry import ops_of
from cake_core.ir.tree import walk
from cake_core.ir.types import DType

ASYNC_MMAS = frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is Completion.MMA_GROUP)
ROW_DTYPES = (DType.F32, DType.I32)


@dataclass(frozen=True)
class Layout:
    """How a role holds one of its rmem tiles (see the module docstring)."""

    kind: str          # "acc", "frag" or "rows"
    role: Node         # the role it is allocated in
    rows: int          # R: 64 per warpgroup of the role
    cols: int          # N (1 for a row vector)

    @property
    def fragment(self) -> bool:
        """Held in the m64nN fragment layout (an accumulator or another fragment)."""
        return self.kind in ("acc", "frag")


def epilogue_state(program: Program) -> set[str]:
    """The rmem tiles a fused epilogue keeps its row state in (the operands it reads and writes)."""
    epilogues = ops_of(Family.EPILOGUE)
    return {a for n, _, _ in walk(program.body) if n.op in epilogues
            for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf" and o.effect_of(n) is Effect.READWRITE}


def _static(shape, env) -> tuple[int, ...] | None:
    try:
        return tuple(int(evaluate(d, env)) for d in shape)
    except Exception:  # noqa: BLE001 - a symbolic or malformed shape: shapes.static reports it
        return None


def layouts_on(program: Program, arch) -> dict[str, Layout]:
    """:func:`role_layouts` with ``arch``'s (``targets.Arch``) wgmma shape and warpgroup size."""
    w = arch.wgmma
    return role_layouts(program, w.m if w else None, arch.warpgroup_warps, w.n_step if w else 8)


def role_layouts(program: Program, m: int | None, warpgroup_warps: int, n_step: int = 8) -> dict[str, Layout]:
    """The layout of every rmem tile allocated inside a role of whole warpgroups that has one. ``m``: wgmma's
    rows per warpgroup on the target (None: no wgmma, so no fragments); ``n_step``: its step of N."""
    if m is None:
        return {}
    nodes = [n for n, _, _ in walk(program.body)]
    accs = {n.arg("acc") for n in nodes if n.op in ASYNC_MMAS}
    state = epilogue_state(program)
    env = program.const_env
    out: dict[str, Layout] = {}
    for role in (n for n in program.body if n.op is Op.ROLE):
        lo, hi = role.args[1]
        if not isinstance(lo, int) or not isinstance(hi, int) or lo % warpgroup_warps or (hi - lo) % warpgroup_warps \
                or hi <= lo:
            continue
        rows = m * (hi - lo) // warpgroup_warps
        for n, _, _ in walk(role.body):
            if n.op is not Op.RMEM or n.result in state:
                continue
            dtype, shape = n.args[0], _static(n.args[1], env)
            if shape is None or len(shape) != 2 or shape[0] != rows:
                continue
            if n.result in accs:
                out[n.result] = Layout("acc", role, rows, shape[1])
            elif shape[1] == 1 and dtype in ROW_DTYPES:
                out[n.result] = Layout("rows", role, rows, 1)
            elif shape[1] % n_step == 0:
                out[n.result] = Layout("frag", role, rows, shape[1])
    return out
