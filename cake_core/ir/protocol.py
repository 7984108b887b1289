"""The protocol checker: simulate the warp roles of every kind of CTA at op level and report deadlocks and races.

``ir.protocol_sim`` simulates one launch configuration (the roles of one cluster of CTAs, or of one CTA);
this module chooses the configurations, runs them under one step budget and turns what they find into
diagnostics. The configurations, and why they cover what runs:

- Problem dimensions: every dimension at ``(stages + 2) * largest const`` (a tile multiple at which every
  ring wraps at least once), then one past it (ragged: ``cdiv`` adds a partial last tile, and an inner
  loop's trip count is odd, so a ring phase that restarts with each outer trip instead of carrying a
  running count falls out of step), then at each value where an ``if`` comparing a dimension with a
  constant turns (every branch is simulated), then each dimension alone at 1 (the first CTA only): every
  loop over it makes one trip, so a ring an outer loop carries (an x tile per output tile) is refilled
  after few trips of an inner ring whose waits would otherwise order the refill after the reads.
- CTAs: the first cluster (or CTA), the second along each grid axis and the last along all of them. What
  a CTA does differs from another's only through its coordinates: in conditions on them (the first, the
  second -- the other parity -- and the last, ragged tile are where those turn) and in the tiles a
  persistent CTA walks (the first and the last walk the most and the fewest).
- ``num_sms``: the smallest power of two (2 or more) at which no persistent tile loop (a loop stepping by
  ``ncta.*``) makes more than :data:`PERSISTENT_TRIPS` trips. That is a launch on a GPU of that many
  SMs: every loop runs whole, and the CTA still walks several tiles, so ring phases carried across tile
  boundaries are followed.
- Interleavings: the fair one (every unfinished role one op per turn), then each role greedy (it runs as
  far as its waits let it before any other moves: a producer that runs ahead of its consumers, or a
  consumer that drains a ring at once), in a cluster in every CTA at once and then in one CTA alone (a
  CTA's producer ahead of its peer's, whose multicast copies its barriers expect). A race is judged by
  what a role has observed (the phases its waits returned on), not by where the others happen to be, so
  it does not depend on the interleaving; a deadlock does only through a wait that can pass on a phase of
  the wrong pass around a ring, which the greedy schedules provoke. That depends on the order of the roles'
  ops, not on the tiles a CTA walks, so the greedy schedules run on the first configuration (tile-multiple
  dimensions, where every ring wraps; the first CTA) and the fair one on every configuration.

A deadlock is reported at its cause: each blocked wait is tried with the other parity; a wait whose
flipped phase lets the configuration finish cleanly is the mistake (a producer's empty wait that does not
start at parity 1 blocks the consumer's full wait too, and the consumer's wait is not at fault). Each
finding's witness names both sides: op, line, role and trip.

Findings (rule ids, all errors): ``protocol.deadlock``, ``protocol.tx_mismatch``,
``protocol.read_before_ready``, ``protocol.slot_reuse``, ``protocol.cluster_read``, ``protocol.proxy_fence``,
``protocol.acc_in_flight``, ``protocol.slot_range`` (a ring slot or barrier index outside its slots at some
trip), ``protocol.multicast_reuse`` (a multicast copy overwrites a peer CTA's slot that the peer's readers
have not released to the copying CTA), and ``protocol.undecided``: the checker could not finish (its step
budget spent, or an op it cannot simulate, with the rule that says why). An undecided protocol is an error:
no finding is not a clean bill.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

from cake_core.ir.expr import Cmp, Sym, UnboundSymbol, evaluate, symbols, try_evaluate
from cake_core.ir.opdef import Alloc
from cake_core.ir.ops import Node, Op
from cake_core.ir.protocol_sim import SCALAR_AT_ZERO, Sim, flipped
from cake_core.ir.protocol_state import Budget, OutOfSteps, Stop, Undecided
from cake_core.ir.tree import loop_range
from cake_core.outcome import Diagnostic, Severity

MAX_STEPS = 100_000     # ops simulated at most over every configuration of one check (a bound on its time)
# ... of a program another rule has already refused: a protocol finding found within them is reported beside the
# other errors; past them the check stops without a verdict of its own (the program is refused already, and its
# protocol is checked in full once those errors are fixed)
REFUSED_STEPS = 20_000
PERSISTENT_TRIPS = 4    # tiles a persistent CTA walks at most in the simulated launch (num_sms is chosen so)
# the most slots of a ring (an smem tile's stages, an mbarrier array) the checker runs around: the dims are sized so
# that every ring wraps, so a ring of a million slots (a mutated count) would spend the step budget on one
# configuration (about 5 s of CPU) before being called undecided; above this it is undecided at once
MAX_RING = 64
RULE_IDS = ("protocol.deadlock", "protocol.tx_mismatch", "protocol.read_before_ready", "protocol.slot_reuse",
            "protocol.cluster_read", "protocol.proxy_fence", "protocol.undecided", "protocol.acc_in_flight",
            "protocol.slot_range", "protocol.multicast_reuse")
_COUNTS = ("ncta.x", "ncta.y", "ncta.z")
# what a simulation raises on an op it cannot evaluate although the other rules let it through
_SIM_ERRORS = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, ArithmeticError, RecursionError)


def check_protocol(ctx: Any, max_steps: int = MAX_STEPS) -> list[Diagnostic]:
    """All protocol findings of a verifier context (``verify.Ctx``), or one ``protocol.undecided`` error (none
    when another rule has refused the program, ``ctx.refused``, and the smaller budget ran out first).

    Parameters
    ----------
    ctx : verify.Ctx
        The verifier's context of the program.
    max_steps : int
        Ops simulated at most over every configuration (the check's time bound); at most ``REFUSED_STEPS``
        when ``ctx.refused``.

    Returns
    -------
    list of Diagnostic
        The findings of the first configuration that has any; empty when every configuration runs clean.
    """
    if not any(n.op is Op.ROLE or n.decl.allocates is Alloc.MBARRIER for n, _, _ in ctx.nodes):
        return []
    refused = getattr(ctx, "refused", False)
    budget = Budget(min(max_steps, REFUSED_STEPS) if refused else max_steps)
    try:
        for i, (env0, origin) in enumerate(_configurations(ctx)):
            found = _run(ctx, env0, origin, budget, [None] + (_role_names(ctx) if i == 0 else []))
            if found:
                return found
    except OutOfSteps as u:
        if refused:
            return []
        return [_undecided(ctx, u, f"the checker spent its budget of {max_steps:,} simulated ops before "
                                   "every configuration was run", "a loop with a large constant trip count (or "
                                   "a loop over a dim nested in another) multiplies the ops to simulate: loop "
                                   "over the dims at tile granularity")]
    except Undecided as u:
        return [_undecided(ctx, u, u.reason, "fix the finding the reason names; the protocol is checked after")]
    return []


def _run(ctx: Any, env0: dict[str, Any], origin: tuple[int, int, int], budget: Budget,
         schedules: list[str | None]) -> list[Diagnostic]:
    """One configuration under ``schedules`` (None: fair; a role: that role greedy): the findings of the first
    schedule that has any (a deadlock diagnosed)."""
    dims = _cluster_dims(ctx)
    for schedule in schedules:
        sim = Sim(ctx, env0, origin, dims, budget, schedule)
        try:
            sim.run(ctx.program.body)
        except Stop:
            pass
        except _SIM_ERRORS as e:
            raise Undecided(f"the simulation cannot evaluate this op ({type(e).__name__}: {e}); the other rules "
                            "name what is malformed", sim.node) from None
        if sim.stuck:
            return _launched(ctx, sim, env0, origin) + [_deadlock(ctx, sim, env0, origin, budget)]
        if sim.diags:
            return _launched(ctx, sim, env0, origin)
    return []


def _launched(ctx: Any, sim: Sim, env0: dict[str, Any], origin: tuple[int, int, int]) -> list[Diagnostic]:
    """``sim``'s findings, each with the launch and schedule it was found in as its last witness line: a race may
    show in one configuration only (a dimension at one tile, a CTA running ahead of its peer)."""
    how = f"{sim.schedule} greedy" if sim.schedule else "fair"
    return [replace(d, witness=d.witness + (f"launch: {_launch(ctx, env0, origin)}; schedule {how}",))
            for d in sim.diags]


def _undecided(ctx: Any, u: Undecided, reason: str, hint: str) -> Diagnostic:
    n = u.node
    path = next((p for m, p, _ in ctx.nodes if m is n), "") if n is not None else ""
    return Diagnostic("protocol.undecided", Severity.ERROR,
                      f"the protocol checker could not decide this kernel: {reason}",
                      n.line if n is not None else (ctx.program.line or 1), n.col if n is not None else 0,
                      path, hint)


# ------------------------------------------------------------------ deadlocks

def _deadlock(ctx: Any, sim: Sim, env0: dict[str, Any], origin: tuple[int, int, int], budget: Budget) -> Diagnostic:
    """The deadlock ``sim`` ran into, reported at the wait whose phase is the mistake when flipping one wait's
    parity lets the configuration finish cleanly; otherwise at the first blocked wait."""
    cause = None
    for s in sim.stuck:
        again = Sim(ctx, env0, origin, sim.cluster_dims, budget, sim.schedule, {id(s.node): flipped(s.node.arg("phase"))})
        try:
            again.run(ctx.program.body)
        except (Stop, Undecided, *_SIM_ERRORS):
            continue
        if not again.stuck and not again.diags:
            cause = s
            break
    at = cause or sim.stuck[0]
    wit = [f"role {s.role}: wait at line {s.node.line} (trip {s.trip}) on {s.key} for the phase of parity "
           f"{s.parity} ({s.done} phases completed, {s.pending} of {s.arrivals} arrivals pending)"
           for s in sim.stuck]
    if sim.finished:
        wit.append(f"finished: {', '.join(sim.finished)}")
    wit.append(f"launch: {_launch(ctx, env0, origin)}")
    if cause is not None:
        others = [s for s in sim.stuck if s is not cause]
        blocked = f"; it blocks {', '.join(f'{s.role} at line {s.node.line}' for s in others)}" if others else ""
        msg = (f"deadlock: {at.role} waits on {at.key} for parity {at.parity} at line {at.node.line}, a phase that "
               f"is already past or never comes{blocked}; with the other parity at this wait the roles finish")
        hint = (f"this wait's phase is off by one pass: {at.key.split('[')[0]} completes a phase per round, so the "
                "wait for round r is parity r % 2 for a full barrier and (r + 1) % 2 for an empty one (its "
                "slots start free)")
    else:
        msg = (f"deadlock: every role is blocked; {at.role} waits on {at.key} for parity {at.parity} at line "
               f"{at.node.line}, which no remaining arrive can complete")
        hint = ("check the wait phases (a producer starts its empty waits at parity 1) and that every barrier gets "
                "its arrivals")
    return Diagnostic("protocol.deadlock", Severity.ERROR, msg, at.node.line, at.node.col,
                      sim.paths.get(id(at.node), ""), hint, tuple(wit))


def _launch(ctx: Any, env0: dict[str, Any], origin: tuple[int, int, int]) -> str:
    dims = ", ".join(f"{d}={env0[d]}" for d in sorted(ctx.dims))
    grid = "x".join(str(env0[c]) for c in _COUNTS)
    at_zero = ", every scalar read as 0 (every fetch_add's old value and compact's count too)" \
        if env0.get(SCALAR_AT_ZERO) else ""
    return f"{dims or 'no dims'}{at_zero}, num_sms={env0['num_sms']}, grid {grid}, first CTA of the run {origin}"


# ------------------------------------------------------------ configurations

def _configurations(ctx: Any) -> Iterator[tuple[dict[str, Any], tuple[int, int, int]]]:
    """(environment, cluster origin) of each configuration, in the order the module docstring gives."""
    consts = ctx.program.const_env
    stages = [n.attr("stages") for n, _, _ in ctx.nodes if n.decl.allocates is Alloc.SMEM]
    stages += [v for n, _, _ in ctx.nodes if n.decl.allocates is Alloc.MBARRIER
               for v in [try_evaluate(n.args[0], consts)] if isinstance(v, int)]
    big = max([v for v in consts.values() if isinstance(v, int) and not isinstance(v, bool)] + [1])
    ring = max([s for s in stages if isinstance(s, int)] + [1])
    if ring > MAX_RING:
        raise Undecided(f"a ring of {ring} slots (smem stages or an mbarrier array): the checker runs every ring "
                        f"around, up to {MAX_RING} slots")
    dim = (ring + 2) * big
    values = list(dict.fromkeys([dim, dim + 1] + _dim_turns(ctx)))
    cluster = _cluster_dims(ctx)
    envs = [{**{d: v for d in ctx.dims}, **consts} for v in values]
    small = _one_tile(ctx, envs[0])
    # values read from memory (`scalar`, `fetch_add`, `compact`) bind their declared maximum; once more at 0 (a
    # loop they bound makes no trip, a condition on them turns the other way)
    if any(n.decl.data_dependent for n, _, _ in ctx.nodes):
        small = small + [{**envs[0], SCALAR_AT_ZERO: 1}]
    for env0 in envs + small:
        env0["num_sms"] = _num_sms(ctx, env0)
        grid = _grid(ctx, env0)
        env0.update(dict(zip(_COUNTS, grid)))
        for origin in _origins(grid, cluster) if not any(env0 is e for e in small) else [(0, 0, 0)]:
            yield env0, origin


def _one_tile(ctx: Any, env: dict[str, Any]) -> list[dict[str, Any]]:
    """``env`` with one dimension at a time at 1 (every loop over it makes one trip), where the grid is still a
    launch. A ring that an outer loop carries (an x tile per output tile, refilled every other tile) is often
    ordered after its reads only by the waits of an inner ring over another dimension while that inner loop makes
    more trips than its ring has slots; with the inner loop at one trip the ring's own empty barrier must do it."""
    out = []
    for d in sorted(ctx.dims):
        e = {**env, d: 1}
        try:
            _grid(ctx, {**e, "num_sms": _num_sms(ctx, e)})
        except Undecided:
            continue
        out.append(e)
    return out


def _grid(ctx: Any, env: dict[str, Any]) -> list[int]:
    grid = []
    for g in ctx.program.grid:
        v = try_evaluate(g, env)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Undecided(f"the grid extent {g} is {v!r} at {', '.join(f'{d}={env[d]}' for d in sorted(ctx.dims))} "
                            f"num_sms={env.get('num_sms')}: not a positive integer (target.grid)")
        grid.append(v)
    return grid + [1] * (3 - len(grid))


def _persistent_loops(ctx: Any) -> list[Node]:
    return [n for n, _, _ in ctx.nodes if n.op is Op.FOR
            and any(symbols(x) & set(_COUNTS) for x in loop_range(n))]


def _num_sms(ctx: Any, env: dict[str, Any]) -> int:
    """The smallest power of two from 2 at which no persistent loop of the first CTA makes more than
    PERSISTENT_TRIPS trips (loops whose range depends on other loops are judged at their least start)."""
    loops = _persistent_loops(ctx)
    m = 2
    if not loops:
        return m
    for _ in range(40):
        e = {**env, "num_sms": m, "bid.x": 0, "bid.y": 0, "bid.z": 0}
        try:
            e.update(dict(zip(_COUNTS, _grid(ctx, e))))
        except Undecided:
            return m
        trips = []
        for n in loops:
            try:
                start, stop, step = (int(evaluate(x, e)) for x in loop_range(n))
            except (UnboundSymbol, ZeroDivisionError, TypeError, ValueError):
                continue
            trips.append(max(-(-(stop - start) // step), 0) if step > 0 else 0)    # len() overflows on huge dims
        if not trips or max(trips) <= PERSISTENT_TRIPS:
            return m
        m *= 2
    return m


def _origins(grid: list[int], cluster: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The first cluster's first CTA, the second cluster's along each axis, the last cluster's (deduplicated,
    inside the grid)."""
    last = tuple(max((g - 1) // c * c, 0) for g, c in zip(grid, cluster))
    out = [(0, 0, 0)]
    for a in range(3):
        o = [0, 0, 0]
        o[a] = cluster[a]
        if o[a] < grid[a]:
            out.append(tuple(o))
    out.append(last)
    return list(dict.fromkeys(out))     # type: ignore[arg-type]


def _role_names(ctx: Any) -> list[str]:
    """The greedy schedules: each role (of every CTA of the cluster at once), then in a cluster each role of one
    CTA alone (``producer@1``: a CTA's producer running ahead of its peer's)."""
    names = list(dict.fromkeys(n.args[0] for n in ctx.program.body if n.op is Op.ROLE))
    cx, cy, cz = _cluster_dims(ctx)
    size = cx * cy * cz
    return names + ([f"{n}@{k}" for n in names for k in range(size)] if size > 1 else [])


def _cluster_dims(ctx: Any) -> tuple[int, int, int]:
    """The cluster shape simulated (at most the target's largest cluster); (1, 1, 1) without one or for a malformed
    one (resources.cluster reports it)."""
    for n in ctx.program.body:
        if n.op is Op.CLUSTER:
            dims = [try_evaluate(d, ctx.consts) for d in n.args[0]] + [1, 1]
            if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims[:3]):
                return (1, 1, 1)
            cx, cy, cz = dims[:3]
            ok = len(n.args[0]) <= 3 and min(cx, cy, cz) >= 1 and cx * cy * cz <= ctx.target.max_cluster_size
            return (cx, cy, cz) if ok else (1, 1, 1)
    return (1, 1, 1)


def _dim_turns(ctx: Any) -> list[int]:
    """The values of the problem dimensions at which an `if` comparing one of them with a constant turns:
    c and c + 1 for each such condition (constants folded)."""
    out: set[int] = set()
    for n, _, _ in ctx.nodes:
        c = n.args[0] if n.op is Op.IF and n.args else None
        if not isinstance(c, Cmp):
            continue
        for x, y in ((c.a, c.b), (c.b, c.a)):
            v = try_evaluate(y, ctx.consts) if isinstance(x, Sym) and x.name in ctx.dims else None
            if isinstance(v, int) and v > 0:
                out |= {v, v + 1}
    return sorted(out)

