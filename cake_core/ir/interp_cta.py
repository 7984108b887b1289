"""The interpreter's machinery: one CTA's state, the statement runner, warp roles and clusters.

Tiles are numpy arrays; bf16 values are float32 rounded to bf16 on every write to a bf16 tile
(:func:`round_to`), as the hardware would store them. Each op's semantics is a function
``(cta, node) -> None`` that its declaration names, defined beside it (``ops_core``, ``ops_async``,
``ops_compute``); :class:`CTA` runs a block by looking each node's op up in the table it is given
(``registry.SEMANTICS``), so this module knows no op but the structure ops it runs itself.

Sibling ``with role(...)`` blocks run as cooperative coroutines (generators) inside one CTA: each role
has its own loop variables and runs until a ``wait`` finds its barrier phase not yet completed, then
yields to the next role. When a whole round passes with every unfinished role blocked, the CTA is
deadlocked: that raises :class:`InterpFault` at the first blocked wait (what the GPU would show as a
hang, caught by the watchdog). The CTAs of a cluster run their roles in the same round-robin.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from cake_core.ir.expr import evaluate
from cake_core.ir.numeric import bf16_round
from cake_core.ir.opdef import Family, Full, Op, Slot, Tile, View
from cake_core.ir.tree import loop_range, walk
from cake_core.ir.types import DType
from cake_core.targets import Arch


class InterpFault(Exception):
    """What a GPU would report as an illegal address or a trap, with the IR line; ``rule`` says which kind
    (``interp.fault``, or ``interp.budget`` for a launch the interpreter will not finish: :class:`Work`)."""

    def __init__(self, node: Any, message: str, rule: str = "interp.fault"):
        super().__init__(f"line {node.line}: {message}")
        self.node, self.message, self.rule = node, message, rule


# The most steps (statements executed and loop trips made, over every CTA) one interpreted launch takes. The
# shapes checked on a CPU are small: the heaviest corpus kernel's launch on the gate's shapes takes under ten
# thousand steps, and a step costs numpy from about ten microseconds to a millisecond (an MMA on a large
# tile). A launch past this bound is a loop nest running far past the problem's tiles (a bound multiplied
# by a constant, a loop over a dim nested in another), which would take minutes: it is refused when the
# bound is spent, a second or so of CPU time for the loops of a small kernel.
MAX_INTERP_STEPS = 100_000


# A statement on large tiles costs more than one step: one more per this many elements it touches (for an MMA,
# multiply-adds over 16), so that a loop of heavy statements (a chunk's products and solves) reaches the budget
# in about the CPU time a loop of light ones does.
ELEMENTS_PER_STEP = 4_096


class Work:
    """The steps one launch has taken, over all its CTAs, up to ``limit``; and the trips each loop made (to
    name the loop that spent them)."""

    __slots__ = ("limit", "used", "trips", "costs", "writers", "ctas")

    def __init__(self, limit: int = MAX_INTERP_STEPS):
        self.limit, self.used = limit, 0
        self.trips: dict[int, list] = {}     # id(for node) -> [node, trips over the launch, most trips per entry]
        self.costs: dict[int, int] = {}      # id(node) -> its steps (its tiles' shapes are fixed in a launch)
        self.writers: dict[str, np.ndarray] = {}   # gmem name -> per element, the CTA that stored it (-1: none)
        self.ctas: dict[tuple[int, int, int], int] = {}   # a CTA's (bid.x, bid.y, bid.z) -> its writer number

    def claim(self, cta: "CTA", n: Any, buf: str, g: tuple, values: np.ndarray) -> None:
        """Record ``cta``'s plain store of ``values`` (shaped as ``gmem[buf][g]``) over ``gmem[buf][g]``. Another CTA of the launch that stored
        a different value into one of those elements before is an InterpFault: on the GPU which store lands last is
        the hardware's choice (a race the interpreter, running CTAs one after another, would otherwise hide)."""
        arr = cta.gmem[buf]
        w = self.writers.get(buf)
        if w is None:
            w = self.writers[buf] = np.full(arr.shape, -1, np.int32)
        me_at = (cta.env.get("bid.x", 0), cta.env.get("bid.y", 0), cta.env.get("bid.z", 0))
        me = self.ctas.setdefault(me_at, len(self.ctas))
        prev = w[g]
        other = (prev >= 0) & (prev != me)
        if other.any():
            old = arr[g]
            same = (old == values) | ((old != old) & (values != values))      # NaN stored twice is the same too
            clash = other & ~same
            if clash.any():
                at = tuple(int(i) for i in np.argwhere(clash)[0])
                first = tuple(s.start + i if isinstance(s, slice) else s for s, i in zip(g, at))
                who = next(c for c, i in self.ctas.items() if i == int(prev[at]))
                raise InterpFault(n, f"CTAs {who} and {me_at} both store `{buf}`{list(first)}, other values: which "
                                     "lands last is the GPU's choice (a race between CTAs); give each element one "
                                     "CTA (windows that do not overlap, a limit= where a window runs on)")
        w[g] = me

    def spend(self, cta: "CTA", n: Any) -> None:
        cost = self.costs.get(id(n))
        if cost is None:
            cost = self.costs[id(n)] = 1 + _elements(cta, n) // ELEMENTS_PER_STEP
        self.used += cost
        if self.used > self.limit:
            raise self._spent(cta, n)

    def enter(self, n: Any, trips: int) -> None:
        t = self.trips.setdefault(id(n), [n, 0, 0])
        t[2] = max(t[2], trips)

    def trip(self, cta: "CTA", n: Any) -> None:
        self.trips[id(n)][1] += 1
        self.spend(cta, n)

    def _spent(self, cta: "CTA", n: Any) -> InterpFault:
        """The fault at the loop with the most trips per entry (a bound past the problem's tiles shows there,
        however many trips the loops inside it made), with the next two; at ``n`` without a loop."""
        at = f"CTA ({cta.env.get('bid.x', 0)}, {cta.env.get('bid.y', 0)}, {cta.env.get('bid.z', 0)})"
        budget = (f"the interpreter's budget of {self.limit:,} steps per launch (statements and loop trips, a "
                  f"statement one more step per {ELEMENTS_PER_STEP:,} elements it touches)")
        if not self.trips:
            return InterpFault(n, f"the launch ran past {budget} at {at}", "interp.budget")
        (loop, total, per), *rest = sorted(self.trips.values(), key=lambda t: (-t[2], -t[1]))
        others = "".join(f"; then `{m.args[0]}` at line {m.line}: {p:,} per entry, {t:,} in all"
                         for m, t, p in rest[:2])
        return InterpFault(loop, f"the launch ran past {budget} at {at}; the loop with the most trips per entry is "
                                 f"`{loop.args[0]}` ({per:,} per entry on this small shape, {total:,} in all{others}): "
                                 "bound it by the problem's tiles (cdiv(dim, tile))", "interp.budget")


def _elements(cta: "CTA", n: Any) -> int:
    """The elements statement ``n`` touches in ``cta`` (its tiles'; for an MMA its multiply-adds over 16, for a
    triangular solve its x's elements times its rows): what its numpy costs, roughly."""
    decl = n.decl
    sizes = {}
    for o, a in zip(decl.operands, n.args):
        name = a.buf if isinstance(a, Slot) else a if o.kind == "buf" else None
        arr = cta.tiles.get(name) if isinstance(name, str) else None
        if arr is not None:
            stages = cta.async_state["stages"].get(name, 1)
            sizes[o.name] = (arr.size // max(stages, 1), arr.shape)
    total = sum(size for size, _ in sizes.values())
    if decl.family is Family.MMA and "acc" in sizes and "a" in sizes:
        k = min(sizes["a"][1][-1], max(sizes["a"][0], 1))
        total = max(total, sizes["acc"][0] * k // 16)
    elif n.op is Op.TRISOLVE and "x" in sizes:
        total = max(total, sizes["x"][0] * sizes["x"][1][0])
    return total


NUMPY = {DType.BF16: np.float32, DType.F16: np.float16, DType.F32: np.float32, DType.I32: np.int32,
         DType.I64: np.int64, DType.BOOL: np.bool_, DType.E4M3: np.float32, DType.E5M2: np.float32}


def round_to(dtype: DType, x: np.ndarray) -> np.ndarray:
    """``x`` as a tile of ``dtype`` holds it (bf16: float32 rounded to bf16)."""
    if dtype is DType.BF16:
        return bf16_round(x)
    return x.astype(NUMPY[dtype])


class CTA:
    """One CTA's tiles, environment and barriers; ``semantics`` maps each op to its function, ``arch`` is the
    program's target (warpgroup sizes), ``work`` the launch's step budget (shared by its CTAs)."""

    def __init__(self, prog: Any, gmem: dict[str, np.ndarray], env: dict[str, int],
                 semantics: Mapping[Op, Callable[["CTA", Any], None]], arch: Arch, work: Work | None = None):
        self.prog, self.gmem, self.env, self.semantics, self.arch = prog, gmem, env, semantics, arch
        self.work = work if work is not None else Work()
        self.tiles: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, DType] = {p.name: p.type.dtype for p in prog.params}
        self.cluster: list[CTA] | None = None
        self._async: dict | None = None

    def ev(self, e: Any) -> int:
        return int(evaluate(e, self.env))

    def put(self, n: Any, buf: str, g: tuple, values: np.ndarray) -> None:
        """gmem[buf][g] = values: a plain store of this CTA (``Work.claim`` checks it against the other CTAs')."""
        arr = self.gmem[buf]
        values = np.asarray(values).reshape(arr[g].shape)
        self.work.claim(self, n, buf, g, values)
        arr[g] = values

    def window(self, n: Any, v: View) -> tuple[list[tuple[int, int, bool]], tuple[int, ...]]:
        """Per dim: (start, length, kept); and where each dimension ends for the window: the gmem shape, or a
        tile's ``limit`` where it comes first (the elements past it are outside, as those past the edge)."""
        arr = self.gmem[v.buf]
        out, edge = [], []
        for i, size in zip(v.index, arr.shape):
            if isinstance(i, Tile):
                s = self.ev(i.size)
                out.append((self.ev(i.base) + self.ev(i.index) * s, s, True))
                edge.append(size if i.limit is None else max(0, min(size, self.ev(i.limit))))
            elif isinstance(i, Full):
                out.append((0, size, True))
                edge.append(size)
            else:
                out.append((self.ev(i.index), 1, False))
                edge.append(size)
        return out, tuple(edge)

    def run(self, nodes: tuple[Any, ...]) -> None:
        i = 0
        while i < len(nodes):
            if nodes[i].op is Op.ROLE:      # consecutive sibling roles run concurrently
                j = i
                while j < len(nodes) and nodes[j].op is Op.ROLE:
                    j += 1
                run_roles(self, nodes[i:j])
                i = j
                continue
            self.work.spend(self, nodes[i])
            self.semantics[nodes[i].op](self, nodes[i])
            i += 1

    @property
    def async_state(self) -> dict:
        """Barriers, the stages of each smem ring, and the warpgroups of the role running now."""
        if self._async is None:
            stages = {n.result: n.attr("stages") for n, _, _ in walk(self.prog.body) if n.op is Op.SMEM}
            self._async = {"bars": {}, "stages": stages, "role_wgs": None, "steps": 0}
        return self._async


def clip(n: Any, v: View, win: list[tuple[int, int, bool]], shape: tuple[int, ...], guard: bool, verb: str):
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


# The most trips one loop makes in the interpreter: its shapes are small, so a loop past this runs far past
# the problem's tiles (a constant bound that does not follow the dims) and would take hours in numpy.
MAX_LOOP_TRIPS = 1 << 15


def loop_values(cta: CTA, n: Any) -> range:
    """The values a ``for`` node's variable takes in this CTA."""
    start, stop, step = (cta.ev(x) for x in loop_range(n))
    if step < 1:
        raise InterpFault(n, f"loop step {step}: a for loop steps by a positive amount")
    trips = max(-(-(stop - start) // step), 0)
    if trips > MAX_LOOP_TRIPS:
        raise InterpFault(n, f"loop `{n.args[0]}` makes {trips:,} trips on this small shape, more than the "
                             f"{MAX_LOOP_TRIPS:,} the interpreter runs: bound it by the problem's tiles "
                             "(cdiv(dim, tile))")
    cta.work.enter(n, trips)
    return range(start, stop, step)


# ------------------------------------------------------------- structure ops

def run_for(cta: CTA, n: Any) -> None:
    var = n.args[0]
    for i in loop_values(cta, n):
        cta.work.trip(cta, n)
        cta.env[var] = i
        cta.run(n.body)
    cta.env.pop(var, None)


def run_if(cta: CTA, n: Any) -> None:
    if evaluate(n.args[0], cta.env):
        cta.run(n.body)


def run_binding(cta: CTA, n: Any) -> None:
    """Bind the names an op binds (its declaration's ``bind``) in the CTA's (or the role's) environment. The
    verifier confines uses to the binding's block, so a name need not be unbound at the block's end (a later
    trip rebinds it). A value that cannot be computed (a division by zero, an argument outside the op's
    domain) is a fault at the binding's line."""
    try:
        cta.env.update(n.decl.bind(n, cta.ev))
    except (ZeroDivisionError, ValueError) as e:
        raise InterpFault(n, f"{n.op.value}: {e}") from None


def run_role(cta: CTA, n: Any) -> None:
    """A role on its own (``CTA.run`` runs siblings together)."""
    run_roles(cta, (n,))


def no_effect(cta: CTA, n: Any) -> None:
    """Ordering ops: tile ops are collective and copies and MMAs complete at issue here, so a barrier, a fence
    or a wait has nothing left to order (races are the verifier's and the protocol checker's to find)."""


# ------------------------------------------------------------------ barriers

class Barrier:
    """One mbarrier: completed phases, arrivals still pending in this phase, transaction bytes outstanding."""

    __slots__ = ("arrivals", "pending", "tx", "done")

    def __init__(self, arrivals: int):
        self.arrivals, self.pending, self.tx, self.done = arrivals, arrivals, 0, 0

    def _settle(self) -> None:
        while self.pending <= 0 and self.tx == 0:
            self.done += 1
            self.pending += self.arrivals

    def arrive(self, count: int = 1) -> None:
        self.pending -= count
        self._settle()

    def expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._settle()

    def passed(self, parity: int) -> bool:
        """try_wait.parity: the phase of this parity has completed."""
        return self.done % 2 != parity % 2


def slot_array(cta: CTA, n: Any, s: Slot, owner: CTA | None = None) -> np.ndarray:
    """The array of one ring slot (or the whole tile when it has one stage); the index is evaluated in
    ``cta``, the slot taken from ``owner`` (a cluster peer: the same slot in another CTA)."""
    owner = owner or cta
    if s.buf not in owner.tiles:
        raise InterpFault(n, f"`{s.buf}` is not allocated")
    arr = owner.tiles[s.buf]
    stages = cta.async_state["stages"].get(s.buf, 1)
    if s.index is None:
        if stages > 1:
            raise InterpFault(n, f"`{s.buf}` is a ring of {stages} stages: index a slot, {s.buf}[s]")
        return arr
    i = cta.ev(s.index)
    if stages == 1:
        if i != 0:
            raise InterpFault(n, f"slot {i} of `{s.buf}`, which has one stage")
        return arr
    if not 0 <= i < stages:
        raise InterpFault(n, f"slot {i} of `{s.buf}` is outside its {stages} stages")
    return arr[i]


def barrier_of(cta: CTA, n: Any, s: Slot, owner: CTA | None = None) -> Barrier:
    bars = (owner or cta).async_state["bars"].get(s.buf)
    if bars is None:
        raise InterpFault(n, f"`{s.buf}` is not an mbarrier")
    i = cta.ev(s.index) if s.index is not None else 0
    if not 0 <= i < len(bars):
        raise InterpFault(n, f"barrier {s.buf}[{i}] is outside its {len(bars)} slots")
    return bars[i]


def peers(cta: CTA, n: Any, mask: int) -> list[CTA]:
    """The CTAs of ``cta``'s cluster that a multicast mask names."""
    if cta.cluster is None:
        raise InterpFault(n, f"multicast={mask:#x} outside a cluster: declare cluster((n, 1, 1))")
    if mask >> len(cta.cluster):
        raise InterpFault(n, f"multicast mask {mask:#x} names CTAs beyond the cluster of {len(cta.cluster)}")
    return [c for r, c in enumerate(cta.cluster) if mask >> r & 1]


# --------------------------------------------------------------- role runner

def _steps(cta: CTA, nodes: tuple[Any, ...], st: dict) -> Iterator[Any]:
    """Run ``nodes`` as a coroutine: yields the blocking wait each time it cannot go on."""
    for n in nodes:
        if n.op is Op.FOR:
            cta.work.spend(cta, n)
            var = n.args[0]
            for i in loop_values(cta, n):
                cta.work.trip(cta, n)
                cta.env[var] = i
                yield from _steps(cta, n.body, st)
            cta.env.pop(var, None)
        elif n.op is Op.IF:
            cta.work.spend(cta, n)
            if cta.ev(n.args[0]):
                yield from _steps(cta, n.body, st)
        elif n.op is Op.WAIT:
            while not barrier_of(cta, n, n.arg("bar")).passed(cta.ev(n.arg("phase"))):
                yield n
            cta.work.spend(cta, n)
            st["steps"] += 1
        elif n.op is Op.ROLE:
            raise InterpFault(n, "roles do not nest")
        else:
            cta.work.spend(cta, n)
            cta.semantics[n.op](cta, n)
            st["steps"] += 1


def run_roles(cta: CTA, roles: tuple[Any, ...]) -> None:
    """Run sibling roles concurrently (round-robin until each blocks); InterpFault on a deadlock."""
    _run_tasks([(cta, roles)])


def _run_tasks(groups: list[tuple[CTA, tuple[Any, ...]]]) -> None:
    """Run the roles of one or more CTAs (the CTAs of a cluster) concurrently, round-robin."""
    tasks, outer = [], {}
    for cta, roles in groups:
        outer[id(cta)] = cta.env
        st = cta.async_state
        for r in roles:
            lo, hi = r.args[1]
            env = dict(cta.env)
            cta.env = env
            tasks.append([r, env, _steps(cta, r.body, st), -(-(hi - lo) // cta.arch.warpgroup_warps), None, cta])
            cta.env = outer[id(cta)]
    live = list(tasks)
    ctas = [c for c, _ in groups]
    try:
        while live:
            before = sum(c.async_state["steps"] for c in ctas)
            for t in list(live):
                cta = t[5]
                cta.env, cta.async_state["role_wgs"] = t[1], t[3]
                try:
                    t[4] = next(t[2])
                except StopIteration:
                    live.remove(t)
            if live and sum(c.async_state["steps"] for c in ctas) == before:
                first = live[0][4]
                parts = []
                for t in live:
                    cta = t[5]
                    cta.env = t[1]
                    b = t[4].arg("bar")
                    slot = cta.ev(b.index) if b.index is not None else 0
                    where = f" (CTA {cta.env['bid.x']})" if len(groups) > 1 else ""
                    parts.append(f"role {t[0].args[0]}{where} waits on {b.buf}[{slot}] for parity "
                                 f"{cta.ev(t[4].arg('phase')) % 2} at line {t[4].line}")
                stuck = "; ".join(parts)
                raise InterpFault(first, f"deadlock: every unfinished role is blocked ({stuck})")
    finally:
        for cta in ctas:
            cta.env, cta.async_state["role_wgs"] = outer[id(cta)], None


def run_clusters(program: Any, gmem: dict, env0: dict, grid: list[int], cl: tuple[int, int, int],
                 outputs: dict, semantics: Mapping[Op, Callable[[CTA, Any], None]], arch: Arch,
                 work: Work | None = None) -> dict:
    """Run the grid cluster by cluster, the CTAs of a cluster concurrently: each runs its statements up to its
    roles, then the roles of all of them round-robin (multicast copies and remote arrivals reach the peers),
    then what follows the roles; ``work`` is the launch's step budget."""
    work = work if work is not None else Work()
    if any(g % c for g, c in zip(grid, cl)):
        raise InterpFault(next(n for n in program.body if n.op is Op.CLUSTER),
                          f"the grid {tuple(grid)} is not a whole number of clusters {cl}: the launch fails")
    for cz, cy, cx in itertools.product(range(grid[2] // cl[2]), range(grid[1] // cl[1]), range(grid[0] // cl[0])):
        members = []
        for z, y, x in itertools.product(range(cl[2]), range(cl[1]), range(cl[0])):
            env = {**env0, "bid.x": cx * cl[0] + x, "bid.y": cy * cl[1] + y, "bid.z": cz * cl[2] + z}
            members.append(CTA(program, gmem, env, semantics, arch, work))
        for c in members:
            c.cluster = members
        body = program.body
        first = next((i for i, n in enumerate(body) if n.op is Op.ROLE), len(body))
        last = max((i for i, n in enumerate(body) if n.op is Op.ROLE), default=first - 1)
        for c in members:
            c.run(body[:first])
        if first <= last:
            _run_tasks([(c, body[first:last + 1]) for c in members])
        for c in members:
            c.run(body[last + 1:])
    return outputs
