"""What a kernel problem is: semantics, inputs, oracle, tolerance, work counts.

A problem names its dimensions (``M``, ``N``, ``K``...): the same names appear
as symbols in the gmem parameter shapes of its IR programs, and a *shape* is
one assignment of them. Inputs are drawn fresh from a seeded generator (never
zeros); outputs are listed so the runtime can poison them before each run.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from cake_core.errors import CakeError

SHAPES_DIR = Path(__file__).resolve().parents[2] / "datasets" / "shapes"
SEEDS_DIR = Path(__file__).resolve().parent / "seeds"


class UnknownProblem(CakeError):
    pass


class ShapeSetError(CakeError):
    pass


Shape = dict[str, int]


def shape_key(shape: Shape) -> str:
    """Canonical text of a shape, e.g. ``M=128,N=96,K=64`` (dimension order of the problem)."""
    return ",".join(f"{k}={v}" for k, v in shape.items())


def parse_shape_key(key: str, dims: tuple[str, ...]) -> Shape:
    try:
        got = dict((k.strip(), int(v)) for k, v in (p.split("=") for p in key.split(",")))
    except ValueError:
        raise ShapeSetError(f"bad shape `{key}`: write it as " + ",".join(f"{d}=<int>" for d in dims)) from None
    if set(got) != set(dims):
        raise ShapeSetError(f"shape `{key}` must give exactly {', '.join(dims)}")
    if min(got.values()) < 1:
        raise ShapeSetError(f"shape `{key}`: dimensions must be ≥ 1")
    return {d: got[d] for d in dims}


@dataclass(frozen=True)
class ShapeSet:
    name: str
    problem: str
    shapes: tuple[Shape, ...]
    roles: tuple[str, ...]          # headline | tail | held_out, one per shape

    def cpu_shapes(self, limit: int) -> list[Shape]:
        """Shapes small enough for the CPU interpreter (every dimension at most ``limit``)."""
        return [s for s in self.shapes if max(s.values()) <= limit]


@dataclass(frozen=True)
class RowOracle:
    """Checking a large shape on a subset of its output rows.

    What a "row" is depends on the problem (gemm: a row of C; knn: a query; kmeans_assign: a point,
    numbered b*N + n; kmeans_update: a cluster, numbered b*K + k). ``count(shape)`` is how many rows
    there are; ``oracle(inputs, rows)`` is the fp64 oracle for those rows alone, in a layout the
    problem's ``compare`` accepts; ``take(outputs, rows)`` cuts the same rows out of a full output;
    ``rows_of_input0(inputs, flat)`` names the rows that element ``flat`` of the first input feeds
    (so a perturbation check can include the row it changed).
    """

    count: Callable[[Shape], int]
    oracle: Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]
    take: Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]
    rows_of_input0: Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Problem:
    name: str
    description: str
    dims: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    make_inputs: Callable[[Shape, np.random.Generator], dict[str, np.ndarray]]
    oracle: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]     # fp64 reference
    rtol: float                     # max |out - ref| / max|ref| allowed
    flops: Callable[[Shape], float]
    bytes: Callable[[Shape], float]  # fewest bytes: each input read once, output written once
    seed_file: str
    cpu_limit: int = 160            # largest dimension the interpreter checks
    shape_sets: tuple[str, ...] = field(default=())
    # outputs the kernel accumulates into (atomics): the harness zeroes them before every launch
    # instead of poisoning them; only for a program that reads or adds into them (see zeroed_for)
    zeroed_outputs: tuple[str, ...] = ()
    # a problem-specific comparison (e.g. argmin/top-k allowing ties by distance), called as
    # compare_fn(got, want, rtol); ``want`` is what ``oracle`` returned (it may carry extra
    # `_`-prefixed entries for the comparison)
    compare_fn: Callable[[dict[str, np.ndarray], dict[str, np.ndarray], float], tuple[bool, float, str]] | None = None
    # the oracle on a subset of rows, for headline shapes whose full fp64 oracle is too slow on a CPU
    # (see :class:`RowOracle`); None where the full oracle is cheap enough or nobody needed one yet
    rows: RowOracle | None = None
    # the best programs known for the problem (files in seeds/), offered beside the naive seed;
    # they may need shapes the seed does not (e.g. TMA's 16-byte-aligned rows): the verifier says so
    best_files: tuple[str, ...] = ()

    def oracle_rows(self, inputs: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        """The oracle for the output rows ``rows`` only (a 1-D index array, see :class:`RowOracle`);
        compare its result with ``compare(take_rows(outputs, rows), ...)``."""
        if self.rows is None:
            raise NotImplementedError(f"problem {self.name} has no row-subset oracle; use the full oracle")
        return self.rows.oracle(inputs, np.asarray(rows, dtype=np.int64))

    def take_rows(self, outputs: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``rows`` of a full output (what a kernel wrote), in the layout ``oracle_rows`` gives."""
        if self.rows is None:
            raise NotImplementedError(f"problem {self.name} has no row-subset oracle")
        return self.rows.take(outputs, np.asarray(rows, dtype=np.int64))

    def zeroed_for(self, accumulated: tuple[str, ...] | None) -> tuple[str, ...]:
        """The zeroed outputs that a program accumulating into ``accumulated`` (its gmem parameters read or
        added into, ``ir.zeroing.accumulated_params``; None: unknown) needs zeroed; the others are poisoned."""
        if accumulated is None:
            return self.zeroed_outputs
        return tuple(n for n in self.zeroed_outputs if n in accumulated)

    def param_mismatch(self, names: list[str] | tuple[str, ...]) -> str:
        """What keeps a kernel with gmem parameters ``names`` from running on this problem ('' if
        nothing): every input and output must be a parameter, and every parameter one of them."""
        wanted = self.inputs + self.outputs
        missing = [n for n in wanted if n not in names]
        extra = [n for n in names if n not in wanted]
        parts = ([f"problem `{self.name}` needs parameters {', '.join(missing)}"] if missing else []) + \
                ([f"parameters {', '.join(extra)} are not inputs or outputs of `{self.name}`"] if extra else [])
        return "; ".join(parts)

    def seed_text(self) -> str:
        return (SEEDS_DIR / self.seed_file).read_text()

    def best_texts(self) -> list[str]:
        return [(SEEDS_DIR / f).read_text() for f in self.best_files]

    def shape_set(self, name: str) -> ShapeSet:
        return load_shape_set(self, name)

    def compare(self, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> tuple[bool, float, str]:
        """(correct, max relative error, message). NaN or an unwritten (poisoned) element fails."""
        if self.compare_fn is not None:
            return self.compare_fn(got, want, self.rtol)
        worst, msg = 0.0, ""
        for name in self.outputs:
            g, w = np.asarray(got[name], dtype=np.float64), np.asarray(want[name], dtype=np.float64)
            if g.shape != w.shape:
                return False, float("inf"), f"{name}: shape {g.shape}, expected {w.shape}"
            bad = ~np.isfinite(g)
            if bad.any():
                idx = tuple(int(i) for i in np.argwhere(bad)[0])
                return False, float("inf"), f"{name}: {int(bad.sum())} non-finite elements (first at {idx}); " \
                                            "unwritten or NaN"
            scale = max(float(np.abs(w).max()), 1e-30)
            err = float(np.abs(g - w).max()) / scale
            if err > worst:
                worst = err
                idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.abs(g - w)), g.shape))
                msg = f"{name}: max rel error {err:.3g} at {idx} (got {g[idx]:.6g}, want {w[idx]:.6g})"
        return worst <= self.rtol, worst, msg


def is_shape_file(name: str) -> bool:
    """True when ``name`` is a path to a CSV file rather than the name of a set in ``datasets/shapes/``."""
    return name.endswith(".csv") or "/" in name or os.sep in name


def load_shape_set(problem: Problem, name: str) -> ShapeSet:
    """Read a shape set (columns: the problem's dims, then ``role``).

    ``name`` is a set under ``datasets/shapes/`` (``gemm_small``), or a path to a
    CSV file, relative or absolute, when it ends in ``.csv`` or holds a ``/``.
    """
    known = sorted(p.stem for p in SHAPES_DIR.glob("*.csv"))
    if is_shape_file(name):
        path = Path(name).expanduser()
        if path.is_dir():
            raise ShapeSetError(f"shape file {path} is a directory; pass the path of a CSV file")
        if not path.is_file():
            raise ShapeSetError(f"no shape file {path} (looked for {path.absolute()}); pass the path of a "
                                f"CSV file, or a set name: {', '.join(known) or 'none'}")
    else:
        path = SHAPES_DIR / f"{name}.csv"
        if not path.exists():
            raise ShapeSetError(f"no shape set `{name}` (looked for {path}); known: {', '.join(known) or 'none'}; "
                                f"a CSV file elsewhere is passed by its path (my_shapes.csv)")
    shapes, roles = [], []
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ShapeSetError(f"{path}: the shape set is empty; add rows with columns {', '.join(problem.dims)}, role")
    missing = [d for d in problem.dims if d not in rows[0]]
    if missing:
        raise ShapeSetError(f"{path}: shape set `{name}` lacks column(s) {', '.join(missing)} that problem "
                            f"`{problem.name}` needs (its dims: {', '.join(problem.dims)})")
    for i, row in enumerate(rows, start=2):
        try:
            shape = {d: int(row[d]) for d in problem.dims}
        except (TypeError, ValueError):
            raise ShapeSetError(f"{path}:{i}: every dimension must be a positive integer, got "
                                f"{json.dumps({d: row.get(d) for d in problem.dims})}") from None
        if min(shape.values()) < 1:
            raise ShapeSetError(f"{path}:{i}: dimensions must be ≥ 1, got {shape_key(shape)}")
        role = (row.get("role") or "headline").strip()
        if role not in ("headline", "tail", "held_out"):
            raise ShapeSetError(f"{path}:{i}: role `{role}` must be headline, tail or held_out")
        shapes.append(shape)
        roles.append(role)
    return ShapeSet(name, problem.name, tuple(shapes), tuple(roles))


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (ties to even), returned as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)
