"""Verifier rules for the compute ops (families: compute, atomic, gather).

Each rule checks one thing the interpreter and the lowering rely on (see
ops_compute.py for the semantics): operands defined and in a usable memory
space, shapes that agree (broadcasts, reductions, running merges, scatter
windows), axes in range, index tiles in i32, float running values, no
aliasing where threads would race, atomics only into f32/i32 gmem, and the
shared-memory scratch that cross-thread ops need within the target's budget.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from cake_core.ir.opdef import Exchange, Family
from cake_core.ir.ops import REGISTRY, Full, Node, Op, View
from cake_core.ir.ops_compute import UNARY_INT_FNS, computes_in_float, scatter_rows_by_4
from cake_core.ir.registry import COMPUTE_OPS, ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, same_extent, smem, view_extent
from cake_core.ir.smem_layout import SCRATCH
from cake_core.ir.shapes import broadcasts_to, norm_axis, reduced_shapes
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

AXIS_OPS = ops_of(Family.AXIS)
RUNNING_OPS = ops_of(Family.RUNNING)
ATOMIC_OPS = ops_of(Family.ATOMIC)
GATHER_OPS = ops_of(Family.GATHER)
# the operand of each compute op that holds i32 indices
_INDEX_OPERANDS = {op: o.name for op in COMPUTE_OPS for o in REGISTRY[op].operands if o.index}
_SAME_SHAPE = (Op.CAST, Op.UNARY, Op.SCAN)
# ops whose outputs must not alias their other operands: threads would overwrite elements others still read
_NOT_IN_PLACE = frozenset(op for op in COMPUTE_OPS if not REGISTRY[op].in_place)
_STAGING = frozenset(op for op in COMPUTE_OPS if any(o.exchange is not Exchange.NONE for o in REGISTRY[op].operands))


def _compute_nodes(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op in COMPUTE_OPS:
            yield n, path


def _tiles(n: Node) -> list[tuple[str, str]]:
    """(operand name, buffer name) of the op's tile operands."""
    return [(o.name, a) for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf"]


def _shape(ctx: Ctx, t: TileType | None) -> tuple[int, ...] | None:
    if t is None:
        return None
    out = []
    for d in t.shape:
        v = ctx.static(d)
        if v is None:
            return None
        out.append(v)
    return tuple(out)


def _sh(ctx: Ctx, name: str) -> tuple[int, ...] | None:
    return _shape(ctx, ctx.buffers.get(name))


def _fmt(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


# ------------------------------------------------------------------ compute

@rule("compute.space", "compute", "compute ops take single-stage tiles, not rings", guards=COMPUTE_OPS)
def _space(ctx: Ctx) -> Iterable[Diagnostic]:
    """A tile's memory space is types.space's; a ring (stages > 1) has no single tile for the op to name."""
    for n, path in _compute_nodes(ctx):
        for name, buf in _tiles(n):
            t = ctx.buffers.get(buf)
            if t is not None and t.space is not MemSpace.GMEM and t.stages > 1:
                yield ctx.diag("compute.space", n, f"`{buf}` is a ring of {t.stages} stages; `{n.op.value}` takes a "
                                                   "single-stage tile", path=path,
                               hint="allocate a separate single-stage tile for the compute")


@rule("compute.shape", "compute", "cast/unary/scan need equal shapes; transpose needs a 2-D source and its reverse",
      guards=_SAME_SHAPE + (Op.TRANSPOSE,))
def _same_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in _SAME_SHAPE and n.op is not Op.TRANSPOSE:
            continue
        d, s = _sh(ctx, n.args[0]), _sh(ctx, n.args[1])
        if d is None or s is None:
            continue
        if n.op is Op.TRANSPOSE:
            if len(s) != 2 or d != s[::-1]:
                yield ctx.diag("compute.shape", n, f"transpose of {_fmt(s)} into {_fmt(d)}: dst must be the 2-D "
                                                   "source's shape reversed", path=path,
                               hint=f"allocate dst as {_fmt(s[::-1]) if len(s) == 2 else '(C, R)'}")
        elif d != s:
            yield ctx.diag("compute.shape", n, f"`{n.op.value}` of a {_fmt(s)} tile into a {_fmt(d)} tile", path=path,
                           hint="dst and src must have the same shape (use reduce/transpose to change it)")


@rule("compute.broadcast", "compute", "an ewise or select source does not broadcast to the destination's shape",
      guards=(Op.EWISE, Op.SELECT))
def _broadcast(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in (Op.EWISE, Op.SELECT):
            continue
        d = _sh(ctx, n.args[0])
        for name, buf in _tiles(n)[1:]:
            s = _sh(ctx, buf)
            if d is not None and s is not None and not broadcasts_to(s, d):
                yield ctx.diag("compute.broadcast", n, f"{n.op.value} operand `{name}` = `{buf}` {_fmt(s)} does not "
                                                       f"broadcast to dst {_fmt(d)}", path=path,
                               hint="a source's dims, aligned right, must equal dst's or be 1: a row vector is "
                                    "(C,), a column vector (R, 1)")


@rule("compute.axis", "compute", "the axis of reduce/scan/argmin/argmax is not an axis of a 1-D or 2-D source, "
                                 "or iota's not one of its destination", guards=AXIS_OPS | {Op.IOTA})
def _axis(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in AXIS_OPS and n.op is not Op.IOTA:
            continue
        s = _sh(ctx, n.args[-1] if n.op in (Op.ARGMIN, Op.ARGMAX) else n.args[0] if n.op is Op.IOTA else n.args[1])
        if s is None:
            continue
        if len(s) > 2:
            yield ctx.diag("compute.axis", n, f"`{n.op.value}` works on 1-D or 2-D tiles; the source is {_fmt(s)}",
                           path=path, hint="reduce a 2-D view of the data: allocate the tile as (rows, cols)")
        elif norm_axis(n.attr("axis"), len(s)) is None:
            yield ctx.diag("compute.axis", n, f"axis={n.attr('axis')} is not an axis of a {len(s)}-D tile "
                                              f"{_fmt(s)}", path=path,
                           hint="use axis=0 (or the default axis=-1) for a 1-D tile")


@rule("compute.reduce_shape", "compute", "a reduction's or a running merge's result does not fit its source",
      guards=(AXIS_OPS - {Op.SCAN}) | RUNNING_OPS)
def _reduce_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op in (Op.REDUCE, Op.ARGMIN, Op.ARGMAX):
            src = _sh(ctx, n.args[-1] if n.op is not Op.REDUCE else n.args[1])
            outs = n.args[:2] if n.op is not Op.REDUCE else n.args[:1]
            if src is None or len(src) > 2 or norm_axis(n.attr("axis"), len(src)) is None:
                continue      # compute.axis reports it
            want = reduced_shapes(src, norm_axis(n.attr("axis"), len(src)))
            for o in outs:
                s = _sh(ctx, o)
                if s is not None and s not in want:
                    yield ctx.diag("compute.reduce_shape", n, f"`{o}` is {_fmt(s)}; reducing {_fmt(src)} along "
                                                              f"axis {n.attr('axis')} gives {_fmt(want[0])}",
                                   path=path, hint=f"allocate `{o}` as {_fmt(want[0])} or {_fmt(want[1])}")
        elif n.op in RUNNING_OPS:
            a, b, scores = (_sh(ctx, x) for x in n.args[:3])
            if scores is None:
                continue
            if len(scores) != 2:
                yield ctx.diag("compute.reduce_shape", n, f"scores must be 2-D (rows, candidates); it is "
                                                          f"{_fmt(scores)}", path=path,
                               hint="compute scores as a (rows, candidates) tile")
                continue
            rows = scores[0]
            # one candidate kept per row: (R,) or (R, 1); k of them: (R, k), the same in both state tiles
            want = [(rows,), (rows, 1)] if REGISTRY[n.op].keeps_per_row == 1 else None
            for name, s in ((n.args[0], a), (n.args[1], b)):
                if s is None:
                    continue
                bad = s not in want if want else (len(s) != 2 or s[0] != rows)
                if bad:
                    w = f"{_fmt(want[0])} or {_fmt(want[1])}" if want else f"({rows}, k)"
                    yield ctx.diag("compute.reduce_shape", n, f"`{name}` is {_fmt(s)}; scores {_fmt(scores)} "
                                                              f"need {w}", path=path,
                                   hint="one running entry (or k) per row of scores")
            if want is None and a is not None and b is not None and a != b:
                yield ctx.diag("compute.reduce_shape", n, f"vals {_fmt(a)} and idx {_fmt(b)} differ in shape",
                               path=path, hint="allocate both as (rows, k)")


@rule("compute.index_dtype", "compute", "the index tiles of the compute ops (arg-reductions, running merges, "
                                        "scatters, gathers) must be i32", guards=_INDEX_OPERANDS)
def _index_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        name = _INDEX_OPERANDS.get(n.op)
        t = ctx.buffers.get(n.arg(name)) if name else None
        if t is not None and t.dtype is not DType.I32:
            yield ctx.diag("compute.index_dtype", n, f"`{n.op.value}` index operand `{name}` = `{n.arg(name)}` is "
                                                     f"{t.dtype.value}", path=path,
                           hint=f"allocate it as rmem(i32, ...) or smem(i32, ...)")


@rule("compute.dtype", "compute", "float-only math on an integer tile, a non-f32 running value, or a fractional "
                                  "integer scale", guards=RUNNING_OPS | {Op.UNARY, Op.EWISE})
def _dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        t = ctx.buffers.get(n.args[0]) if isinstance(n.args[0], str) else None
        if t is None:
            continue
        if n.op is Op.UNARY and not t.dtype.is_float and n.attr("fn") not in UNARY_INT_FNS:
            yield ctx.diag("compute.dtype", n, f"unary fn=\"{n.attr('fn')}\" into an {t.dtype.value} tile",
                           path=path, hint=f"write into an f32 tile; on integers only {', '.join(UNARY_INT_FNS)}")
        dtypes = {x: ctx.buffers[x].dtype for x in n.args[:3] if isinstance(x, str) and x in ctx.buffers}
        if n.op is Op.EWISE and set(n.args) <= set(dtypes) and not computes_in_float(dtypes, n):
            for k in ("alpha", "beta"):
                if n.attr(k) != int(n.attr(k)):
                    yield ctx.diag("compute.dtype", n, f"{k}={n.attr(k)} on an ewise computed in i32 (the "
                                                       f"{t.dtype.value} destination, or a compare of integer "
                                                       "tiles)", path=path,
                                   hint="integer ewise takes whole-number alpha and beta; use an f32 dst (or "
                                        "compare f32 tiles)")
        if n.op in RUNNING_OPS and t.dtype is not DType.F32:
            yield ctx.diag("compute.dtype", n, f"running values `{n.args[0]}` are {t.dtype.value}; "
                                               f"`{n.op.value}` keeps them in f32", path=path,
                           hint=f"allocate `{n.args[0]}` as rmem(f32, ...) filled with inf")


@rule("compute.alias", "compute", "an op's outputs alias each other or a source that other threads still read",
      guards=_NOT_IN_PLACE)
def _alias(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in _NOT_IN_PLACE:
            continue
        tiles = [o for o in REGISTRY[n.op].operands if o.kind == "buf"]
        # each output against every later tile operand: another output, or a source
        pairs = [(x.name, y.name) for i, x in enumerate(tiles) if x.effect_of(n).writes for y in tiles[i + 1:]]
        for x, y in pairs:
            if n.arg(x) == n.arg(y):
                yield ctx.diag("compute.alias", n, f"`{n.op.value}` operands `{x}` and `{y}` are the same tile "
                                                   f"`{n.arg(x)}`", path=path,
                               hint="give the result its own tile: threads would overwrite elements others read")


@rule("compute.trisolve", "compute", "trisolve needs x (N, M) and a square l (N, N), both f32",
      guards=(Op.TRISOLVE,))
def _trisolve(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.TRISOLVE:
            continue
        x_t, l_t = ctx.buffers.get(n.arg("x")), ctx.buffers.get(n.arg("l"))
        if x_t is None or l_t is None:
            continue                     # types.undefined says so
        bad = [f"`{name}` is {t.dtype.value}" for name, t in ((n.arg("x"), x_t), (n.arg("l"), l_t))
               if t.dtype is not DType.F32]
        if bad:
            yield ctx.diag("compute.trisolve", n, f"trisolve solves in f32: {', '.join(bad)}", path=path,
                           hint="cast the operands into f32 smem tiles first")
        x, low = _shape(ctx, x_t), _shape(ctx, l_t)
        if x is None or low is None:
            continue
        if len(x) != 2 or low != (x[0], x[0]):
            yield ctx.diag("compute.trisolve", n, f"trisolve of x {_fmt(x)} by l {_fmt(low)}: l must be square with "
                                                  "as many rows as x", path=path,
                           hint="x is (N, M) and l (N, N)")


@rule("compute.scratch_smem", "compute", "the scratch a cross-thread compute op stages rmem tiles through ends past "
                                         "the target's shared memory", guards=_STAGING)
def _scratch(ctx: Ctx) -> Iterable[Diagnostic]:
    """The scratch is placed by ``ir.smem_layout`` after the tiles allocated before the op, as the lowering
    places it; a tile that ends past the limit is resources.smem's."""
    lay, limit = smem(ctx), ctx.target.smem_per_cta_bytes
    first = lay.first_past(limit)
    if lay.total is None or lay.total <= limit or first is None or first.kind != SCRATCH:
        return
    path = next((p for m, p, _ in ctx.nodes if m is first.node), "")
    yield ctx.diag("compute.scratch_smem", first.node, f"`{first.node.op.value}` exchanges rmem tiles through "
                                                       f"{first.nbytes} B of shared scratch at offset {first.offset}; "
                                                       f"the CTA needs {lay.total} B, more than the {limit} B of "
                                                       f"{ctx.target.arch}", path=path, witness=[lay.breakdown()],
                   hint="put the operands in smem tiles (no scratch needed), or shrink the tiles")


# ------------------------------------------------------------------- atomic

@rule("atomic.space", "atomic", "atomic_add must target a gmem kernel parameter; scatter_add a gmem parameter or "
                                "an smem tile", guards=ATOMIC_OPS)
def _atomic_space(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op in ATOMIC_OPS:
            v = n.args[0]
            t = ctx.buffers.get(v.buf)
            if t is None or t.space is MemSpace.GMEM or (n.op is Op.SCATTER_ADD and t.space is MemSpace.SMEM):
                continue
            where = "gmem or an smem tile" if n.op is Op.SCATTER_ADD else "gmem"
            yield ctx.diag("atomic.space", n, f"`{n.op.value}` into `{v.buf}`, an {t.space.value} tile; atomics "
                                              f"here add into {where}", path=path,
                           hint="use ewise(dst, dst, src, fn=\"add\") for a tile, or name a gmem parameter")


@rule("atomic.dtype", "atomic", "atomics add into f32 or i32 gmem (or smem) only, and into i32 only from an i32 "
                                "tile", guards=ATOMIC_OPS)
def _atomic_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in ATOMIC_OPS:
            continue
        d = ctx.buffers.get(n.args[0].buf)
        s = ctx.buffers.get(n.arg("src"))
        if d is None or d.space is MemSpace.RMEM:
            continue
        if d.dtype not in (DType.F32, DType.I32):
            yield ctx.diag("atomic.dtype", n, f"`{n.op.value}` into `{n.args[0].buf}` of dtype {d.dtype.value}",
                           path=path, hint="accumulate into an f32 (or i32) output and convert afterwards")
        elif d.dtype is DType.I32 and s is not None and s.dtype is not DType.I32:
            yield ctx.diag("atomic.dtype", n, f"`{n.op.value}` adds a {s.dtype.value} tile into i32 "
                                              f"`{n.args[0].buf}`", path=path,
                           hint="cast(...) the tile into an i32 tile first")


@rule("atomic.shape", "atomic", "the tile of an atomic add does not match its gmem window", guards=ATOMIC_OPS)
def _atomic_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _compute_nodes(ctx):
        if n.op not in ATOMIC_OPS:
            continue
        v = n.args[0]
        ext = view_extent(ctx, v)
        src = ctx.buffers.get(n.arg("src"))
        if ext is None or src is None:
            continue
        if n.op is Op.ATOMIC_ADD:
            if not same_extent(ctx, src.shape, ext):
                yield ctx.diag("atomic.shape", n, f"tile {fmt_shape(ctx, src.shape)} does not match the window "
                                                  f"{fmt_shape(ctx, ext)} of `{v.buf}`", path=path,
                               hint="make the tile() sizes equal the tile's shape")
            continue
        idx = ctx.buffers.get(n.arg("idx"))
        problems = []
        if len(ext) not in (1, 2):
            problems.append(f"the window of `{v.buf}` has rank {len(ext)}; 1 or 2 needed")
        elif len(src.shape) != len(ext) or not same_extent(ctx, src.shape[1:], ext[1:]):
            problems.append(f"src {fmt_shape(ctx, src.shape)} does not scatter into rows of the window "
                            f"{fmt_shape(ctx, ext)}")
        if idx is not None and (len(idx.shape) != 1 or not same_extent(ctx, idx.shape, src.shape[:1])):
            problems.append(f"idx {fmt_shape(ctx, idx.shape)} must be ({fmt_shape(ctx, src.shape[:1])[1:-1]},): "
                            "one index per src row")
        for p in problems:
            yield ctx.diag("atomic.shape", n, p, path=path,
                           hint="window (E, C) takes src (R, C) and idx (R,); window (E,) takes src (R,)")


@rule("atomic.vector", "atomic", "a scatter_add with vector=4 adds an rmem src (R, C), C a multiple of 4 dividing the "
                                 "threads, into the rows of an f32 gmem window", guards=(Op.SCATTER_ADD,))
def _atomic_vector(ctx: Ctx) -> Iterable[Diagnostic]:
    threads, warp = ctx.program.threads, ctx.target.warp_size
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.SCATTER_ADD or n.attr("vector") != 4:
            continue
        d, src = ctx.buffers.get(n.args[0].buf), ctx.buffers.get(n.arg("src"))
        if d is None or src is None:
            continue
        dims = [ctx.static(x) for x in src.shape]
        problems = []
        if d.space is not MemSpace.GMEM or d.dtype is not DType.F32:
            problems.append(f"its target `{n.args[0].buf}` is {d.dtype.value} {d.space.value}, not f32 gmem")
        if src.space is not MemSpace.RMEM or len(dims) != 2:
            problems.append(f"its src `{n.arg('src')}` is a rank-{len(dims)} {src.space.value} tile, not an (R, C) "
                            "rmem tile")
        elif None not in dims and threads > 0:     # no threads: resources.threads says so
            R, C = dims
            if not scatter_rows_by_4(R, C, threads, warp):
                problems.append(f"its src is ({R}, {C}) over {threads} threads: C must be a multiple of 4 that "
                                f"divides the threads (a multiple of {warp}), each thread on one column of whole "
                                "rows")
        for p in problems:
            yield ctx.diag("atomic.vector", n, f"scatter_add(..., vector=4): {p}", path=path,
                           hint="drop vector=4 (element atomics), or shape the src (R, C) with C % 4 == 0 and "
                                "threads % C == 0")


@rule("atomic.owner", "atomic", "a warp-owned scatter_add (owner=\"warp\") adds an smem src into an smem tile",
      guards=(Op.SCATTER_ADD,))
def _atomic_owner(ctx: Ctx) -> Iterable[Diagnostic]:
    """Ownership splits the target rows between the CTA's warps, so the target is one CTA's tile; each warp
    reads every source row it owns, so the source is in shared memory, not spread over other threads' registers."""
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.SCATTER_ADD or n.attr("owner") != "warp":
            continue
        for role, name in (("target", n.args[0].buf), ("source", n.args[2])):
            t = ctx.buffers.get(name)
            if t is not None and t.space is not MemSpace.SMEM:
                yield ctx.diag("atomic.owner", n, f"owner=\"warp\" scatter_add with the {role} `{name}` in "
                                                  f"{t.space.value}; warps own rows of an smem tile",
                               path=path, hint="stage the source with cp_async/load into an smem tile and "
                                               "accumulate into smem(f32, (K, C)); or drop owner=\"warp\"")


@rule("atomic.smem_target", "atomic", "a scatter_add into shared memory takes a whole single-stage smem tile",
      guards=(Op.SCATTER_ADD,))
def _atomic_smem_target(ctx: Ctx) -> Iterable[Diagnostic]:
    """The privatised accumulator: the lowering adds into the tile itself (``t[:, :]``), with shared-memory
    atomics; a window of it or a ring slot would need index arithmetic that the op does not define."""
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.SCATTER_ADD:
            continue
        v = n.args[0]
        t = ctx.buffers.get(v.buf)
        if t is None or t.space is not MemSpace.SMEM:
            continue
        if t.stages > 1:
            yield ctx.diag("atomic.smem_target", n, f"scatter_add into `{v.buf}`, a ring of {t.stages} stages",
                           path=path, hint="accumulate into a single-stage smem tile: smem(f32, (K, C))")
        elif len(v.index) != t.rank or not all(isinstance(i, Full) for i in v.index):
            yield ctx.diag("atomic.smem_target", n, f"scatter_add into a window of smem tile `{v.buf}`; the "
                                                    "target is the whole tile", path=path,
                           hint=f"write `{v.buf}[{', '.join([':'] * t.rank)}]`; scatter rows are the tile's rows")
        elif t.rank not in (1, 2):
            yield ctx.diag("atomic.smem_target", n, f"scatter_add into the rank-{t.rank} smem tile `{v.buf}`",
                           path=path, hint="accumulate into an (E, C) or (E,) tile")


# ------------------------------------------------------------------- gather

def _whole_smem(ctx: Ctx, v: View, rank: int, dtype: DType, what: str) -> str | None:
    """Why the view ``v`` is not a whole single-stage smem tile of ``rank`` and ``dtype`` (None if it is)."""
    t = ctx.buffers.get(v.buf)
    if t is None:
        return None
    if t.space is not MemSpace.SMEM:
        return f"the {what} `{v.buf}` is in {t.space.value}; gather_add adds into one CTA's smem tile"
    if t.stages > 1:
        return f"the {what} `{v.buf}` is a ring of {t.stages} stages"
    if len(v.index) != t.rank or not all(isinstance(i, Full) for i in v.index):
        return f"the {what} is a window of `{v.buf}`; gather_add takes the whole tile, `{v.buf}[{', '.join([':'] * t.rank)}]`"
    if t.rank != rank:
        return f"the {what} `{v.buf}` has rank {t.rank}; {rank} needed"
    if t.dtype is not dtype:
        return f"the {what} `{v.buf}` is {t.dtype.value}; gather_add's {what} is {dtype.value}"
    return None


@rule("gather.target", "gather", "gather_add adds into a whole single-stage smem tile (E, C) of f32 and counts into "
                                 "one (E,) of i32", guards=GATHER_OPS)
def _gather_target(ctx: Ctx) -> Iterable[Diagnostic]:
    """Warps own rows of the target, so it is one CTA's tile, added whole; the sums are f32 and the counts i32,
    one count per target row."""
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.GATHER_ADD:
            continue
        dst, cnt = n.args[0], n.args[1]
        why = [w for w in (_whole_smem(ctx, dst, 2, DType.F32, "target"), _whole_smem(ctx, cnt, 1, DType.I32, "count"))
               if w]
        d, c = ctx.buffers.get(dst.buf), ctx.buffers.get(cnt.buf)
        if not why and d is not None and c is not None and not same_extent(ctx, d.shape[:1], c.shape):
            why.append(f"the target `{dst.buf}` has {fmt_shape(ctx, d.shape[:1])[1:-1]} rows and the count "
                       f"`{cnt.buf}` {fmt_shape(ctx, c.shape)[1:-1]} entries; one count per row")
        for w in why:
            yield ctx.diag("gather.target", n, w, path=path,
                           hint="acc_s = smem(f32, (E, C)); cnt_s = smem(i32, (E,)); "
                                "gather_add(acc_s[:, :], cnt_s[:], idx_s, q_s, src[...], base=..., limit=..., first=...)")


@rule("gather.source", "gather", "gather_add reads a rank-2 gmem window (R, C) of bf16, f16 or f32 with one i32 "
                                 "smem index per row", guards=GATHER_OPS)
def _gather_source(ctx: Ctx) -> Iterable[Diagnostic]:
    """The rows are read from gmem by the warp that owns their target row, so the source is a gmem window
    whose columns match the target's; every warp reads every index, so the indices sit in shared memory."""
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.GATHER_ADD:
            continue
        dst, idx_name, src = n.args[0], n.args[2], n.arg("src")
        g, ix, d = ctx.buffers.get(src.buf), ctx.buffers.get(idx_name), ctx.buffers.get(dst.buf)
        why = []
        if g is not None and g.space is not MemSpace.GMEM:
            why.append(f"the source `{src.buf}` is in {g.space.value}; gather_add reads rows of a gmem tensor")
        elif g is not None and g.dtype not in (DType.BF16, DType.F16, DType.F32):
            why.append(f"the source `{src.buf}` is {g.dtype.value}; bf16, f16 or f32 rows are added")
        ext = view_extent(ctx, src) if g is not None else None
        if g is not None and g.space is MemSpace.GMEM and (ext is None or len(ext) != 2):
            why.append(f"the window of `{src.buf}` has rank {len(ext) if ext else '?'}; a (R, C) window is needed")
        if ix is not None and ix.space is not MemSpace.SMEM:
            why.append(f"the index tile `{idx_name}` is in {ix.space.value}; every warp reads every index, so it "
                       "sits in smem")
        if ext is not None and len(ext) == 2:
            if ix is not None and (len(ix.shape) != 1 or not same_extent(ctx, ix.shape, ext[:1])):
                why.append(f"idx {fmt_shape(ctx, ix.shape)} must be ({fmt_shape(ctx, ext[:1])[1:-1]},): one index "
                           "per source row")
            if d is not None and d.rank == 2 and not same_extent(ctx, d.shape[1:], ext[1:]):
                why.append(f"the source window {fmt_shape(ctx, ext)} and the target {fmt_shape(ctx, d.shape)} "
                           "differ in columns")
        for w in why:
            yield ctx.diag("gather.source", n, w, path=path,
                           hint="src is x[b, tile(i, R), tile(j, C)] over a gmem tensor, idx an smem(i32, (R,)) "
                                "tile (cp_async it in)")


@rule("gather.queue", "gather", "gather_add's queue is a whole (R + 2 * warps * warps,) i32 smem tile, and every "
                                "thread of the CTA runs it (outside roles)", guards=GATHER_OPS)
def _gather_queue(ctx: Ctx) -> Iterable[Diagnostic]:
    """The lowering sorts the rows to their owning warps through the queue: R entries for the rows (each packs
    its row and target row in 16 bits, so R and E are at most 65536) and two warps x warps tables of counts
    and positions. Its three CTA barriers need every thread of the CTA, so it cannot run inside a role."""
    for n, path in _compute_nodes(ctx):
        if n.op is not Op.GATHER_ADD:
            continue
        q_name, idx_name, dst = n.arg("queue"), n.arg("idx"), n.arg("dst")
        q, ix, d = ctx.buffers.get(q_name), ctx.buffers.get(idx_name), ctx.buffers.get(dst.buf)
        warps = ctx.program.threads // ctx.target.warp_size
        r = ctx.static_numel(ix.shape) if ix is not None else None
        why = []
        if id(n) in ctx.role_of:
            why.append(f"gather_add inside role `{ctx.role_of[id(n)].args[0]}`: it synchronises the whole CTA "
                       "three times, so every thread must run it")
        if q is not None:
            if q.space is not MemSpace.SMEM or q.stages > 1 or q.dtype is not DType.I32 or q.rank != 1:
                why.append(f"the queue `{q_name}` is a {q.space.value} {q.dtype.value} tile of shape "
                           f"{fmt_shape(ctx, q.shape)}" + (f" in {q.stages} stages" if q.stages > 1 else "")
                           + "; a single-stage rank-1 i32 smem tile is needed")
            elif r is not None and ctx.static_numel(q.shape) is not None \
                    and ctx.static_numel(q.shape) < r + 2 * warps * warps:
                why.append(f"the queue `{q_name}` holds {ctx.static_numel(q.shape)} entries; {r} rows and two "
                           f"{warps}x{warps} tables need {r + 2 * warps * warps}")
        if r is not None and r > 65536:
            why.append(f"{r} source rows: a queue entry holds the row in 16 bits, so at most 65536")
        e = ctx.static(d.shape[0]) if d is not None and d.rank == 2 else None
        if e is not None and e > 65536:
            why.append(f"the target has {e} rows: a queue entry holds the target row in 16 bits, so at most 65536")
        for w in why:
            yield ctx.diag("gather.queue", n, w, path=path,
                           hint=f"q_s = smem(i32, (R + {2 * warps * warps},)) for {warps} warps; call gather_add "
                                "at the top level, between sync()s")
