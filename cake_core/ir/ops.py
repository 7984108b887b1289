"""The op registry: one ``Op`` enum, one ``Node`` type, one ``OpDef`` per op.

An op's registration says what its operands and attributes are, whether it
binds a result or opens a block, and documents it (the reference that people
and the LLM agent read is generated from here). Interpreter semantics,
lowering and cost are hooks kept in their own packages (``ir.interp``,
``lower``, ``model``) keyed by the same ``Op``; a test checks that every op has
all three.

All tile ops are CTA-collective: every thread of the CTA executes them and
they act on whole tiles. An ``rmem`` tile is distributed over the CTA's
threads: element ``e`` of the flattened tile lives in thread ``e % threads``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cake_core.ir.expr import Expr


class Op(str, enum.Enum):
    # -- allocation
    SMEM = "smem"
    RMEM = "rmem"
    # -- movement gmem <-> smem <-> rmem
    LOAD = "load"
    STORE = "store"
    # -- synchronisation
    SYNC = "sync"
    # -- matrix multiply-accumulate
    MMA = "mma"
    # -- structure
    FOR = "for"
    IF = "if"
    LET = "let"
    # -- async (Hopper: roles, mbarriers, TMA, wgmma; see ops_async.py)
    ROLE = "role"
    MBARRIER = "mbarrier"
    EXPECT_TX = "expect_tx"
    ARRIVE = "arrive"
    WAIT = "wait"
    TMA_LOAD = "tma_load"
    TMA_STORE = "tma_store"
    CP_ASYNC = "cp_async"
    CP_ASYNC_WAIT = "cp_async_wait"
    CP_ASYNC_BAR = "cp_async_bar"
    FENCE_ASYNC = "fence_async"
    CLUSTER = "cluster"
    CLUSTER_SYNC = "cluster_sync"
    WGMMA = "wgmma"
    WGMMA_WAIT = "wgmma_wait"
    ARGMIN_BIAS = "argmin_bias"
    TOPK_BIAS = "topk_bias"
    SQNORM_ROWS = "sqnorm_rows"
    TOPK_PUBLISH = "topk_publish"
    TOPK_CLUSTER_MERGE = "topk_cluster_merge"
    ACC_PUBLISH = "acc_publish"
    ACC_CLUSTER_REDUCE = "acc_cluster_reduce"
    TCGEN05_MMA = "tcgen05_mma"
    # -- compute (tile math, reductions, running arg-min / top-k, atomics; see ops_compute.py)
    FILL = "fill"
    CAST = "cast"
    UNARY = "unary"
    EWISE = "ewise"
    TRANSPOSE = "transpose"
    REDUCE = "reduce"
    SCAN = "scan"
    ARGMIN = "argmin"
    ARGMAX = "argmax"
    ARGMIN_UPDATE = "argmin_update"
    TOPK_MERGE = "topk_merge"
    ATOMIC_ADD = "atomic_add"
    SCATTER_ADD = "scatter_add"
    GATHER_ADD = "gather_add"


# Operand kinds: what the parser accepts in each positional slot.
#   dtype: a dtype name      shape: a tuple of index expressions
#   buf:   a buffer name     view: buf[index, ...] over a gmem buffer
#   expr:  an index expression


@dataclass(frozen=True)
class AttrSpec:
    kind: type            # bool, int, float, str
    default: Any
    choices: tuple = ()   # allowed values, empty = any of kind


@dataclass(frozen=True)
class OpDef:
    op: Op
    operands: tuple[tuple[str, str], ...]   # (name, kind)
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    result: bool = False                   # binds `name = op(...)`
    block: bool = False                    # has a body
    summary: str = ""
    example: str = ""
    preconditions: tuple[str, ...] = ()
    keyword_operands: tuple[str, ...] = ()  # operands written `name=value`, after the positional ones


REGISTRY: dict[Op, OpDef] = {}


def register(d: OpDef) -> OpDef:
    REGISTRY[d.op] = d
    return d


def opdef(name: str) -> OpDef | None:
    try:
        return REGISTRY[Op(name)]
    except ValueError:
        return None


register(OpDef(Op.SMEM, (("dtype", "dtype"), ("shape", "shape")),
               {"swizzle": AttrSpec(int, 0, (0, 32, 64, 128)), "stages": AttrSpec(int, 1)},
               result=True,
               summary="Allocate a shared-memory tile for one CTA (a ring of `stages` copies).",
               example="a_s = smem(bf16, (BM, BK), swizzle=128)",
               preconditions=("shape is static (constants only)", "total smem per CTA within the target")))
register(OpDef(Op.RMEM, (("dtype", "dtype"), ("shape", "shape")),
               {"fill": AttrSpec(float, 0.0)},
               result=True,
               summary="Allocate a register tile distributed over the CTA's threads, filled with `fill`.",
               example="acc = rmem(f32, (BM, BN), fill=0.0)",
               preconditions=("shape is static", "elements divisible by threads")))
register(OpDef(Op.LOAD, (("dst", "buf"), ("src", "view")),
               {"guard": AttrSpec(bool, True)},
               summary="Copy a gmem tile into an smem or rmem tile; with guard, elements past the "
                       "tensor's edge read as zero.",
               example="load(a_s, a[tile(bid.y, BM), tile(kt, BK)])",
               preconditions=("dst shape equals the view's extent", "same dtype")))
register(OpDef(Op.STORE, (("dst", "view"), ("src", "buf")),
               {"guard": AttrSpec(bool, True)},
               summary="Write an rmem or smem tile to a gmem tile (converting to the gmem dtype); with "
                       "guard, elements past the edge are skipped.",
               example="store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)",
               preconditions=("src shape equals the view's extent",)))
register(OpDef(Op.SYNC, (),
               summary="CTA-wide barrier (__syncthreads): all smem writes before it are visible after it.",
               example="sync()",
               preconditions=("not inside role-divergent code",)))
register(OpDef(Op.MMA, (("acc", "buf"), ("a", "buf"), ("b", "buf")),
               {"atom": AttrSpec(str, "fma", ("fma", "mma_sync", "wgmma"))},
               summary="acc += a @ b with fp32 accumulation, using the named MMA atom.",
               example='mma(acc, a_s, b_s, atom="fma")',
               preconditions=("acc is rmem f32 (M, N); a is (M, K); b is (K, N)",
                              "a and b share a 16-bit dtype (or f32 with atom=fma)")))
register(OpDef(Op.FOR, (("var", "name"), ("extent", "expr"), ("start", "expr"), ("step", "expr")),
               {"unroll": AttrSpec(int, 1)},
               block=True,
               summary="A sequential loop `for var in range(extent):`, or `range(start, stop, step)` (var = start, "
                       "start + step, ... while var < stop), executed by the whole CTA (or role). A persistent "
                       "kernel's tile loop reads `for t in range(bid.x, tiles, ncta.x):` with "
                       "`grid=(min(tiles, num_sms),)`: each CTA walks every ncta.x-th tile, and ring phases "
                       "continue across tiles through a running k-tile count such as "
                       "`(t - bid.x) // ncta.x * cdiv(K, BK) + kt` (bind it once per trip, `it = ...`: see `let`).",
               example="for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):",
               preconditions=("bounds are uniform across the CTA", "step is positive")))


def for_args(var: str, stop: Expr, start: Expr = 0, step: Expr = 1) -> tuple:
    """The canonical operands of a ``for``: ``(var, stop)`` for ``range(stop)``, else ``(var, stop, start, step)``."""
    return (var, stop) if start == 0 and step == 1 else (var, stop, start, step)


def loop_range(n: "Node") -> tuple[Expr, Expr, Expr]:
    """``(start, stop, step)`` of a ``for`` node (``range(stop)`` is ``(0, stop, 1)``)."""
    return (0, n.args[1], 1) if len(n.args) == 2 else (n.args[2], n.args[1], n.args[3])
register(OpDef(Op.IF, (("cond", "cond"),),
               block=True,
               summary="Run the body only when the condition holds: `if a < b:` over index expressions "
                       "(uniform across the CTA: conditions see consts, dims, loop variables and bid only).",
               example="if kt < cdiv(K, BK) - 1:",
               preconditions=("one comparison (<, <=, >, >=, ==, !=); no else branch",)))
register(OpDef(Op.LET, (("var", "name"), ("value", "expr")),
               summary="Bind a name to an index expression, written `name = expr` (an expression, not an op call): "
                       "later statements of the same block, and the blocks nested in it, may use the name wherever "
                       "an index expression goes, so a long index is written once. Evaluated by the whole CTA (or "
                       "role) where it stands, again on every trip of an enclosing loop; uniform like a `for` "
                       "extent. A runtime value: smem/rmem shapes, tile sizes and other compile-time operands "
                       "take consts, not bindings.",
               example="kt0 = (t - bid.x) // ncta.x * cdiv(K, BK)",
               preconditions=("a new name: not a const, dim, parameter, buffer, loop variable or binding in scope",
                              "used only after it, within its block",
                              "an integer expression (no float literal)",
                              "not between two sibling roles (bind before the first role or inside a role)")))


# --------------------------------------------------------------------- views

@dataclass(frozen=True)
class Tile:
    """``tile(i, n)``: elements [i*n, i*n + n) of a dimension."""

    index: Expr
    size: Expr


@dataclass(frozen=True)
class Full:
    """``:`` — the whole dimension."""


@dataclass(frozen=True)
class At:
    """A single index of a dimension (the dimension is dropped)."""

    index: Expr


Index = Tile | Full | At


@dataclass(frozen=True)
class View:
    """A rectangular window of a gmem buffer: ``buf[index, ...]``."""

    buf: str
    index: tuple[Index, ...]


# ---------------------------------------------------------------------- node

@dataclass(frozen=True)
class Node:
    """One statement. ``args`` follow the OpDef's operands; ``attrs`` are the
    non-default attributes, sorted by name (so equal programs are equal)."""

    op: Op
    args: tuple[Any, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    result: str | None = None
    body: tuple["Node", ...] = ()
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    def attr(self, name: str) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return REGISTRY[self.op].attrs[name].default

    def arg(self, name: str) -> Any:
        names = [n for n, _ in REGISTRY[self.op].operands]
        return self.args[names.index(name)]


def make_attrs(op: Op, given: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Canonical attrs: drop defaults, sort by name."""
    specs = REGISTRY[op].attrs
    return tuple(sorted((k, v) for k, v in given.items() if k not in specs or v != specs[k].default))


from cake_core.ir import ops_async, ops_compute  # noqa: E402,F401  (more registrations)
