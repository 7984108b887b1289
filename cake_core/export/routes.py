"""An exported dispatcher's decisions, from measured rows: per shape, the fastest kernel measured correct there.

Pure: rows in (plain dicts, as ``warehouse.queries.export_rows`` reads them), routes out. A measurement
counts when it is correct, timed with CUDA events from a cold L2 (``runtime.timing``: ``cuda_event``,
``cold-clean``), of a kernel the final stage never found wrong (``confirm_failures``) and never measured
wrong on that shape. A kernel's time on a shape is its confirmation median where the final stage re-measured
it, else its search median (the fastest of each kind when several runs measured it). Kernels are identified by
their IR hash, so one kernel found by two runs is one kernel.

A held-out shape's measurements decide nothing unless asked (:func:`set_aside_held_out`): the held-out rows
measure how the package serves shapes it was not chosen on, so they are served like any shape no run measured.

Each :class:`Route` is one kernel and the measured shapes it wins (``exact``: served through one exact-key
table), and, when asked, one ``domain`` route per kernel: the kernels that may serve a shape no run measured.
The exported dispatcher serves such a shape with the kernel that won the nearest measured shape (the sum over
the dims of |log2 a - log2 b|; ties to the smaller shape key) among those whose domain holds it, and refuses it
when none does. A route's domain is the kernel's (``cake_core.ir.domain``) as plain data (:func:`domain_data`),
so the exported module checks it without Cake.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cake_core.errors import CakeError
from cake_core.ir.domain import GRID_LIMITS, accesses_of, kernel_domain
from cake_core.ir.expr import fmt_expr, symbols, try_evaluate
from cake_core.ir.program import Program

EVENT_TIMER = "cuda_event"
COLD_L2 = "cold"          # an l2 state that starts with it (``cold-clean``) is a cold-L2 measurement


class ExportError(CakeError):
    """What keeps a problem's kernels from being exported (said in one line)."""


@dataclass(frozen=True)
class Win:
    """One kernel's time on one shape, and the peer's there."""

    shape: str
    median_ms: float
    kind: str                      # confirm | search: which measurement the median is
    run_id: str
    attempt_id: str
    peer: str | None = None
    peer_ms: float | None = None
    held_out: bool = False

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "kind": self.kind, "run_id": self.run_id, "attempt_id": self.attempt_id,
                "peer": None if self.peer is None else {"name": self.peer, "median_ms": self.peer_ms},
                "held_out": self.held_out}


@dataclass(frozen=True)
class Route:
    """A kernel (its IR hash) and the shapes it serves: ``exact`` ones it won, or (``domain``) its domain."""

    kind: str                      # exact | domain
    ir_hash: str
    wins: tuple[Win, ...] = field(default=())


def usable(row: dict) -> bool:
    """Whether a measurement row can decide a route: timed by CUDA events from a cold L2."""
    return row["timer"] == EVENT_TIMER and str(row["l2"]).startswith(COLD_L2)


def gpu_models(rows: list[dict]) -> list[str]:
    """The GPU models the rows were measured on, sorted."""
    return sorted({r["gpu_model"] for r in rows})


def fastest(rows: list[dict], gpu_model: str, failed: set[str], shapes: set[str] | None = None) -> dict[str, dict]:
    """Per shape, the winning measurement on ``gpu_model`` (see the module doc): shape -> row (with its
    ``median_ms`` the kernel's time there). ``failed``: attempts the final stage found wrong; ``shapes``: only
    these (None: every measured shape)."""
    mine = [r for r in rows if r["gpu_model"] == gpu_model and usable(r) and (shapes is None or r["shape"] in shapes)]
    wrong = {(r["ir_hash"], r["shape"]) for r in mine if not r["correct"]} | \
        {(r["ir_hash"], r["shape"]) for r in mine if r["attempt_id"] in failed}
    failed_kernels = {r["ir_hash"] for r in mine if r["attempt_id"] in failed}
    best: dict[tuple[str, str], dict] = {}      # (shape, ir_hash) -> its row: confirm beats search, then fastest
    for r in mine:
        if not r["correct"] or (r["ir_hash"], r["shape"]) in wrong or r["ir_hash"] in failed_kernels:
            continue
        key = (r["shape"], r["ir_hash"])
        cur = best.get(key)
        rank = (r["kind"] != "confirm", r["median_ms"], r["attempt_id"])
        if cur is None or rank < (cur["kind"] != "confirm", cur["median_ms"], cur["attempt_id"]):
            best[key] = r
    out: dict[str, dict] = {}
    for (shape, _), r in sorted(best.items()):
        cur = out.get(shape)
        if cur is None or (r["median_ms"], r["ir_hash"]) < (cur["median_ms"], cur["ir_hash"]):
            out[shape] = r
    return out


def peer_best(peers: list[dict], gpu_model: str) -> dict[str, tuple[str, float]]:
    """Per shape, the fastest peer measured correct on ``gpu_model`` (cold L2, CUDA events): (name, median)."""
    out: dict[str, tuple[str, float]] = {}
    for p in peers:
        if p["gpu_model"] != gpu_model or not p["correct"] or p["median_ms"] is None or not usable(p):
            continue
        if p["shape"] not in out or p["median_ms"] < out[p["shape"]][1]:
            out[p["shape"]] = (p["name"], float(p["median_ms"]))
    return out


def cede(winners: dict[str, dict], peers: dict[str, tuple[str, float]]) -> tuple[dict[str, dict], dict[str, dict]]:
    """The winners on shapes where no peer measured faster, and the shapes ceded to a faster peer: shape key ->
    the peer's name and median and the kernel's (a tie goes to the kernel)."""
    kept, ceded = {}, {}
    for shape, r in winners.items():
        name, ms = peers.get(shape, (None, None))
        if ms is not None and ms < float(r["median_ms"]):
            ceded[shape] = {"peer": name, "peer_ms": ms, "ours_ms": float(r["median_ms"]), "ir_hash": r["ir_hash"]}
        else:
            kept[shape] = r
    return kept, ceded


def set_aside_held_out(winners: dict[str, dict], held_out: set[str]) -> tuple[dict[str, dict], list[str]]:
    """The winners on shapes that are not held out, and the held-out shapes set aside (sorted)."""
    return ({s: r for s, r in winners.items() if s not in held_out}, sorted(s for s in winners if s in held_out))


def build_routes(winners: dict[str, dict], peers: dict[str, tuple[str, float]], held_out: set[str],
                 domain_routes: bool = False) -> list[Route]:
    """One exact route per winning kernel (most shapes won first), then, with ``domain_routes``, one domain
    route per kernel in the same order (the order decides nothing for them: the nearest measured shape does)."""
    by_kernel: dict[str, list[Win]] = {}
    for shape, r in winners.items():
        name, ms = peers.get(shape, (None, None))
        by_kernel.setdefault(r["ir_hash"], []).append(
            Win(shape, float(r["median_ms"]), r["kind"], r["run_id"], r["attempt_id"], name, ms, shape in held_out))
    order = sorted(by_kernel, key=lambda h: (-len(by_kernel[h]), min(w.median_ms for w in by_kernel[h]), h))
    routes = [Route("exact", h, tuple(by_kernel[h])) for h in order]
    if domain_routes:
        routes += [Route("domain", h) for h in order]
    return routes


# ---------------------------------------------------------------- domains as plain data

def _conds(conds, names: set[str]) -> list[str] | None:
    """The conditions as text, leaving out those over names a shape does not give (a CTA coordinate, a loop
    variable): ``ir.domain`` counts an access under one as taken. None when one is false on every shape."""
    out = []
    for c in conds:
        if symbols(c) <= names:
            out.append(fmt_expr(c))
        elif try_evaluate(c, {}) is False:
            return None
    return out


def domain_data(program: Program, dims: tuple[str, ...]) -> dict:
    """``program``'s domain as plain data: ``extents`` (per tensor axis along a dimension, every access with its
    static end, null when unbounded, and the conditions it runs under), ``multiples`` (an expression that must
    be a multiple of a value, under conditions) and ``grid`` (each grid extent that depends on the shape alone,
    with CUDA's largest launch along its axis); what ``dispatcher_template.domain_refusal`` checks."""
    consts = program.const_env
    names = set(dims) | set(consts)
    extents = []
    for p in program.params:
        for axis, dim in enumerate(p.type.shape):
            if try_evaluate(dim, consts) is not None:
                continue
            acc = []
            for a in accesses_of(program, p.name):
                when = _conds(a.conds, names) if a.axis == axis else None
                if when is not None and {"end": a.end, "when": when} not in acc:
                    acc.append({"end": a.end, "when": when})
            if any(a["end"] is not None for a in acc):
                extents.append({"param": p.name, "axis": axis, "dim": fmt_expr(dim), "accesses": acc})
    multiples = []
    for b in kernel_domain(program):
        when = _conds(b.conds, names)
        if b.kind != "%" or when is None:
            continue
        entry = {"rule": b.rule, "param": b.param, "expr": fmt_expr(b.expr), "value": b.value, "when": when}
        if entry not in multiples:
            multiples.append(entry)
    grid = [{"axis": "xyz"[i], "extent": fmt_expr(g), "max": GRID_LIMITS[i]}
            for i, g in enumerate(program.grid)
            if try_evaluate(g, consts) is None and {str(x) for x in symbols(g)} <= names]   # num_sms: the device's
    return {"extents": extents, "multiples": multiples, "grid": grid}
