"""Strict gate shapes: chosen per program, from its own tiles, rings and thresholds, so that every code
path of the program runs on the CPU interpreter (and on the GPU gate beside the shape set's shapes).

A shape set written per problem cannot know a candidate's tiles: with 160 per dimension a 4-stage ring
of 64-wide tiles never wraps, and a kernel that skips every centroid past 256 is never caught. For a
program, :func:`strict_shapes` gives shapes with, in every dimension of the problem:

- several tiles and a tail: 2 of the largest tile along it plus a remainder that is no tile's multiple
  (the smallest remainder the program's domain accepts: TMA's 16-byte strides take multiples of 8); a
  dimension no tile runs along (a batch) is 2;
- ring wrap-around: every loop whose body indexes a ring (``x % S``, S static) runs more than S trips,
  the dimensions of its extent grown tile by tile until it does;
- one more shape past each threshold the program writes against a dimension (``if K <= KMAX``,
  ``min(cdiv(K, BK), 4)``), so that the code on both sides of it runs;

and always inside the program's domain (``ir.domain``): a dimension the domain bounds stays under the
bound, with a tail where the bound leaves room. Shapes whose flops + bytes pass ``max_work`` (the
interpreter's budget: the strict gate of one candidate costs about a second) are left out, and
:func:`strict_shapes` says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from cake_core.ir.domain import domain_violations, expand_lets, kernel_domain, lets_of, walk_with_conds
from cake_core.ir.expr import Bin, Call, Cmp, Expr, Sym, symbols, try_evaluate
from cake_core.ir.ops import REGISTRY, Node, Op, Tile, View, loop_range
from cake_core.ir.program import Program
from cake_core.problems.base import Problem, Shape

MAX_WORK = 4e8                 # flops + bytes (the problem's counts) of the largest shape the strict CPU gate runs
MAX_EXTENT = 1 << 14           # no dimension is grown past this
_CTA = {"bid.x": 0, "bid.y": 0, "bid.z": 0, "ncta.x": 1, "ncta.y": 1, "ncta.z": 1, "num_sms": 132}


@dataclass(frozen=True)
class StrictShapes:
    shapes: tuple[Shape, ...]
    why: tuple[str, ...]            # one line per shape: what it exercises
    skipped: tuple[str, ...] = ()   # thresholds whose shape would exceed the budget

    def beyond(self, given: list[Shape]) -> list[tuple[Shape, str]]:
        """The strict shapes not among ``given`` (the shapes already checked), each with what it exercises."""
        return [(s, why) for s, why in zip(self.shapes, self.why) if s not in given]


def tile_sizes(program: Program) -> dict[str, set[int]]:
    """Static tile sizes along each problem dimension (a gmem axis whose extent is that dimension)."""
    consts, lets = program.const_env, lets_of(program)
    params = {p.name: p for p in program.params}
    out: dict[str, set[int]] = {}
    for n, _, _, _ in walk_with_conds(program.body):
        for kind, arg in zip((o.kind for o in REGISTRY[n.op].operands), n.args):
            if kind != "view" or not isinstance(arg, View) or arg.buf not in params:
                continue
            for i, dim in zip(arg.index, params[arg.buf].type.shape):
                if isinstance(i, Tile) and isinstance(dim, Sym) and dim.name not in consts:
                    size = try_evaluate(expand_lets(i.size, lets), consts)
                    if size is not None and size > 1:
                        out.setdefault(dim.name, set()).add(int(size))
    return out


def _mods(e: Expr) -> Iterator[tuple[Expr, Expr]]:
    if isinstance(e, Bin):
        if e.op == "%":
            yield e.a, e.b
        yield from _mods(e.a)
        yield from _mods(e.b)
    elif isinstance(e, (Cmp,)):
        yield from _mods(e.a)
        yield from _mods(e.b)
    elif isinstance(e, Call):
        for a in e.args:
            yield from _mods(a)


def _exprs(n: Node) -> Iterator[Expr]:
    for kind, arg in zip((o.kind for o in REGISTRY[n.op].operands), n.args):
        if kind in ("expr", "cond"):
            yield arg
        elif kind == "slot" and getattr(arg, "index", None) is not None:
            yield arg.index                        # a ring slot: buf[index]
        elif kind == "view" and isinstance(arg, View):
            for i in arg.index:
                for part in (getattr(i, "index", None), getattr(i, "size", None)):
                    if part is not None:
                        yield part


def ring_loops(program: Program) -> list[tuple[Node, int]]:
    """Loops whose body indexes a ring with their variable (``... % S``, S static > 1): (loop, S)."""
    consts, lets = program.const_env, lets_of(program)
    out: list[tuple[Node, int]] = []

    def visit(nodes: tuple[Node, ...]) -> None:
        for n in nodes:
            if n.op is Op.FOR:
                var, stages = n.args[0], 0
                for m, _, _, _ in walk_with_conds(n.body):
                    for e in _exprs(m):
                        for a, b in _mods(expand_lets(e, lets)):
                            s = try_evaluate(b, consts)
                            if s is not None and s > 1 and var in symbols(a):
                                stages = max(stages, int(s))
                if stages:
                    out.append((n, stages))
            if n.body:
                visit(n.body)

    visit(program.body)
    return out


def loop_trips(n: Node, shape: Shape, consts: dict[str, int], lets: dict[str, Expr]) -> int | None:
    """Trips of loop ``n`` on ``shape`` in the first CTA (bid 0; ncta 1, num_sms 132 where a grid needs them)."""
    start, stop, step = (try_evaluate(expand_lets(v, lets), {**_CTA, **consts, **shape}) for v in loop_range(n))
    if start is None or stop is None or not step:
        return None
    return max(0, -(-(int(stop) - int(start)) // int(step)))


def _thresholds(program: Program, dims: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """(dim, smallest value past the threshold, the expression) for each static bound the program compares a
    single dimension against (``if`` conditions, ``min``/``max`` with a static side)."""
    consts, lets = program.const_env, lets_of(program)
    found: list[tuple[Expr, Expr, str]] = []

    def scan(e: Expr) -> None:
        if isinstance(e, Cmp):
            found.append((e.a, e.b, "if"))
        if isinstance(e, Call) and e.fn in ("min", "max"):
            found.append((e.args[0], e.args[1], e.fn))
        for sub in ((e.a, e.b) if isinstance(e, (Bin, Cmp)) else e.args if isinstance(e, Call) else ()):
            scan(sub)

    for n, _, _, _ in walk_with_conds(program.body):
        for e in _exprs(n):
            scan(expand_lets(e, lets))
        if n.op is Op.FOR:
            for e in loop_range(n):
                scan(expand_lets(e, lets))
    out = []
    for a, b, how in found:
        for lhs, rhs in ((a, b), (b, a)):
            c = try_evaluate(rhs, {**_CTA, **consts})
            free = symbols(lhs) - set(consts) - set(_CTA)
            if c is None or len(free) != 1 or next(iter(free)) not in dims:
                continue
            d = next(iter(free))
            v = _first_past(lhs, d, c, consts)
            if v is not None:
                out.append((d, v, how))
    return out


def _first_past(e: Expr, d: str, c: float, consts: dict[str, int]) -> int | None:
    """The smallest d >= 1 with e(d) > c, e taken as non-decreasing in d; None past MAX_EXTENT."""
    def past(v: int) -> bool:
        got = try_evaluate(e, {**_CTA, **consts, d: v})
        return got is not None and got > c
    if past(1):
        return None                 # already past at the smallest shape: nothing to cross
    hi = 2
    while not past(hi):
        hi *= 2
        if hi > MAX_EXTENT:
            return None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if past(mid) else (mid, hi)
    return hi


def _fits(program: Program, problem: Problem, shape: Shape) -> bool:
    return not domain_violations(program, shape) and not problem.shape_error(shape)


def _with_tail(program: Program, problem: Problem, shape: Shape, d: str, base: int, tiles: set[int],
               cap: int | None) -> int:
    """``base`` plus the smallest remainder that no tile of ``d`` divides and the domain accepts (at most
    ``cap``); where the cap leaves no room above, the largest such value under it; else the largest value
    the domain accepts."""
    step = max(tiles) if tiles else 2
    for r in range(1, step + 1):
        v = base + r
        if cap is not None and v > cap:
            break
        if all(v % t for t in tiles) and _fits(program, problem, {**shape, d: v}):
            return v
    top = min(base, cap) if cap is not None else base
    for v in range(top, max(top - 4 * step, 0), -1):
        if all(v % t for t in tiles) and _fits(program, problem, {**shape, d: v}):
            return v
    return next((v for v in range(top, 0, -1) if _fits(program, problem, {**shape, d: v})), top)


def _caps(program: Program) -> dict[str, int]:
    caps: dict[str, int] = {}
    for b in kernel_domain(program):
        if b.rule == "domain.extent" and isinstance(b.expr, Sym):
            caps[b.expr.name] = min(caps.get(b.expr.name, b.value), b.value)
    return caps


def _work(problem: Problem, shape: Shape) -> float:
    return problem.flops(shape) + problem.bytes(shape)


def strict_shapes(program: Program, problem: Problem, max_work: float = MAX_WORK) -> StrictShapes:
    """Shapes for the strict gate of ``program`` (see the module doc): the first exercises several tiles,
    tails and ring wrap-around in every dimension; one more per threshold the program writes. Every shape
    is inside the program's domain and the problem's shape rules."""
    tiles, caps = tile_sizes(program), _caps(program)
    # two of the largest tile in every dimension (under the domain's bounds), then a tail in each
    shape: Shape = {d: min(2 * max(tiles.get(d, {1})), caps.get(d, 1 << 62)) for d in problem.dims}
    shape = _repair(program, problem, shape, tiles, caps)
    for d in problem.dims:
        if d in tiles:      # an untiled dimension has no tail: 2 (two CTAs or trips along it) is enough
            shape[d] = _with_tail(program, problem, shape, d, shape[d], tiles[d], caps.get(d))
    shape = _repair(program, problem, shape, tiles, caps)
    why = ["several tiles and a tail in every dimension"]
    skipped: list[str] = []
    for loop, stages in ring_loops(program):
        grown = _wrap(program, problem, shape, loop, stages, tiles, caps)
        if grown != shape and _work(problem, grown) <= max_work:
            shape = grown
            why[0] = "several tiles, a tail and every ring wrapping around"
        elif grown != shape:
            skipped.append(f"the ring of `for {loop.args[0]}` (line {loop.line}, {stages} stages) wraps only at "
                           f"{', '.join(f'{k}={v}' for k, v in grown.items())}: over the interpreter's budget")
    shapes = [shape]
    for d, past, how in _thresholds(program, problem.dims):
        # the side of the threshold the first shape is not on: past it, or under it
        step = max(tiles.get(d, {1}))
        if shape[d] < past:
            v = _with_tail(program, problem, shape, d, past + step - 1, tiles.get(d, set()), caps.get(d))
            side, ok = "past", lambda s: s[d] >= past
        else:
            v = _with_tail(program, problem, shape, d, past - 1, set(), min(past - 1, caps.get(d, past)))
            side, ok = "under", lambda s: s[d] < past
        s = _repair(program, problem, {**shape, d: v}, tiles, caps)
        if not ok(s) or not _fits(program, problem, s) or s in shapes:
            continue
        if _work(problem, s) > max_work:
            skipped.append(f"{d} = {s[d]} ({side} a `{how}` threshold at {past}): over the interpreter's budget")
            continue
        shapes.append(s)
        why.append(f"{d} {side} the `{how}` threshold at {past}")
    if _work(problem, shapes[0]) > max_work:
        skipped.append(f"{shapes[0]}: over the interpreter's budget")
        shapes, why = shapes[1:], why[1:]
    return StrictShapes(tuple(shapes), tuple(why), tuple(skipped))


def _wrap(program: Program, problem: Problem, shape: Shape, loop: Node, stages: int, tiles: dict[str, set[int]],
          caps: dict[str, int]) -> Shape:
    """``shape`` grown, a tile at a time in the cheapest dimension that adds trips, until ``loop`` runs more
    than ``stages`` trips (its ring wraps around); ``shape`` itself when no dimension adds any."""
    consts, lets = program.const_env, lets_of(program)
    grown = dict(shape)
    for _ in range(256):
        trips = loop_trips(loop, grown, consts, lets)
        if trips is None or trips > stages:
            break
        best = None
        for d in problem.dims:
            step, mult = max(tiles.get(d, {1})), 1
            while grown[d] + mult * step <= min(caps.get(d, MAX_EXTENT), MAX_EXTENT):   # trips may step by several tiles
                trial = {**grown, d: grown[d] + mult * step}
                t = loop_trips(loop, trial, consts, lets)
                if t is not None and t > trips:
                    if _fits(program, problem, trial):
                        cost = _work(problem, trial)
                        if best is None or cost < best[0]:
                            best = (cost, trial)
                    break
                mult *= 2
        if best is None:
            break
        grown = best[1]
    return grown if _fits(program, problem, grown) else shape


def _repair(program: Program, problem: Problem, shape: Shape, tiles: dict[str, set[int]],
            caps: dict[str, int]) -> Shape:
    """``shape`` with each dimension a problem rule or the domain rejects moved to the nearest accepted value."""
    shape = dict(shape)
    for _ in range(4):
        if _fits(program, problem, shape):
            return shape
        msg = problem.shape_error(shape)
        for d in problem.dims:
            if _fits(program, problem, shape):
                break
            if domain_violations(program, shape) or msg:
                cand = _with_tail(program, problem, shape, d, shape[d], tiles.get(d, set()), caps.get(d))
                if _fits(program, problem, {**shape, d: cand}):
                    shape[d] = cand
    return shape
