"""What a kernel problem is: semantics, inputs, oracle, tolerance, work counts.

A problem names its dimensions (``M``, ``N``, ``K``...): the same names appear
as symbols in the gmem parameter shapes of its IR programs, and a *shape* is
one assignment of them. Inputs are drawn fresh from a seeded generator (never
zeros); outputs are listed so the runtime can poison them before each run.

Inputs, oracles and comparisons are written once over an array module ``xp``:
numpy on the CPU, CuPy on a GPU (the arrays say which, :func:`array_module`), so
the GPU gate draws its inputs, computes its fp64 reference and compares on the
device with the same code the CPU gate runs. A :class:`Sampler` makes the draws.

Contract of every problem: products are accumulated in fp32 or wider (a score
rounded to bf16 before an argmin or a top-k is wrong: the inputs plant near ties
that it cannot separate).
"""
from __future__ import annotations

import csv
import enum
import sys
import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from cake_core.errors import CakeError
from cake_core.ir.numeric import bf16_round  # noqa: F401 - the problems' inputs are bf16 values

KERNELS = "kernels"      # a problem folder's naive seed and hand-written references (.cake)
SHAPES = "shapes"        # a problem folder's shape sets (.csv)


class UnknownProblem(CakeError):
    pass


class ProblemSpecError(CakeError):
    """A problem's definition is malformed (said in one line: which problem, which field, what to change)."""


class ShapeSetError(CakeError):
    pass


Shape = dict[str, int]


def array_module(*arrays: Any):
    """``cupy`` when any of ``arrays`` is a CuPy array, else ``numpy`` (CuPy is imported only then)."""
    for a in arrays:
        if type(a).__module__.split(".")[0] == "cupy":
            return sys.modules["cupy"]      # a CuPy array in hand: CuPy is loaded (the runtime loaded it)
    return np


def to_host(a: Any) -> np.ndarray:
    """``a`` as a numpy array (a copy from the device for a CuPy array)."""
    return a.get() if hasattr(a, "get") and type(a).__module__.split(".")[0] == "cupy" else np.asarray(a)


class Sampler:
    """The seeded draws a problem's ``make_inputs`` makes, on numpy (a ``numpy.random.Generator``) or on
    a GPU (a ``cupy.random.Generator``: the values differ from numpy's, the distributions do not)."""

    def __init__(self, xp: Any, gen: Any):
        self.xp, self.gen = xp, gen

    def normal(self, shape: tuple[int, ...]):
        """Standard normal float32 values."""
        return self.gen.standard_normal(shape, dtype=np.float32)

    def uniform(self, shape: tuple[int, ...]):
        """Uniform float64 values in [0, 1)."""
        return self.gen.random(shape)

    def integers(self, low: int, high: int, shape: tuple[int, ...]):
        """Uniform int64 values in [low, high)."""
        return self.gen.integers(low, high, size=shape)


def as_sampler(rng: Any) -> Sampler:
    """A :class:`Sampler` for ``rng`` (a Sampler already, or a ``numpy.random.Generator``)."""
    return rng if isinstance(rng, Sampler) else Sampler(np, rng)


def seed_words(seed: int, shape: Shape, stream: int = 0) -> list[int]:
    """The seed sequence of one (seed, shape) draw: the gates' inputs depend on the shape itself, never on
    its position in a list, so a shape's inputs (and its cached reference) are the same in every run."""
    digest = hashlib.sha256(",".join(f"{k}={v}" for k, v in sorted(shape.items())).encode()).digest()
    return [int(seed), int.from_bytes(digest[:8], "little"), int(stream)]


def input_sampler(seed: int, shape: Shape, xp: Any = np, stream: int = 0) -> Sampler:
    """The sampler of the gate's inputs for ``shape`` under ``seed``, on ``xp`` (numpy or cupy)."""
    return Sampler(xp, xp.random.default_rng(seed_words(seed, shape, stream)))


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


ROLES = ("headline", "tail", "held_out", "sweep")     # a shape set row's roles (ShapeSet.roles)
SEARCHED = ("headline", "tail")                      # the roles a search ranks on


@dataclass(frozen=True)
class ShapeSet:
    name: str
    problem: str
    shapes: tuple[Shape, ...]
    # headline | tail | held_out | sweep, one per shape; sweep: never searched, the run's finalists measured on it
    # after the search (a portfolio region's run sweeps the portfolio's other rows)
    roles: tuple[str, ...]

    def cpu_shapes(self, limit: int) -> list[Shape]:
        """Shapes small enough for the CPU interpreter (every dimension at most ``limit``)."""
        return [s for s in self.shapes if max(s.values()) <= limit]


@dataclass(frozen=True)
class RowOracle:
    """Checking a large shape on a subset of its output rows.

    What a "row" is depends on the problem (a GEMM: a row of C; a nearest-neighbour search: a query; an
    assignment of batched points: a point, numbered b*N + n; per-cluster sums: a cluster, numbered b*K + k).
    ``count(shape)`` is how many rows
    there are; ``oracle(inputs, rows)`` is the fp64 oracle for those rows alone, in a layout the
    problem's ``compare`` accepts; ``take(outputs, rows)`` cuts the same rows out of a full output;
    ``rows_of_perturbed(inputs, flat)`` names the rows that element ``flat`` of the perturbed input
    (``Problem.perturbed``, the first float input) feeds
    (so a perturbation check recomputes only those). Rows are host (numpy) index arrays; inputs
    and outputs may live on either array module.

    Each output maps its elements to rows: by default an output reshaped to ``(count, -1)`` has one row per
    RowOracle row; ``views`` gives another map for an output laid out otherwise (output name -> a function of
    the full output and the shape returning a view whose first axis is the row, e.g. ``lambda a, s: a.T`` for
    an output whose rows are its columns, or ``lambda a, s: a.reshape(s["H"], s["T"], -1).transpose(1, 0, 2)``
    for a head-major one). ``take`` defaults to the rows of those views.
    """

    count: Callable[[Shape], int]
    oracle: Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]
    take: Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]] | None = None
    rows_of_perturbed: Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray] | None = None
    views: Mapping[str, Callable[[Any, Shape], Any]] = field(default_factory=dict)

    def view(self, name: str, a: Any, shape: Shape) -> Any:
        """Output ``name``'s full array ``a`` with one row of this oracle per index of its first axis (a view:
        writing into it writes into ``a``)."""
        f = self.views.get(name)
        v = a.reshape(self.count(shape), -1) if f is None else f(a, shape)
        if v.shape[0] != self.count(shape):
            raise ProblemSpecError(f"the row view of output `{name}` has {v.shape[0]} rows, the RowOracle counts "
                                   f"{self.count(shape)} for {shape_key(shape)}")
        return v


class Role(str, enum.Enum):
    """What a problem's tensor is to a kernel, and so how the gate treats it."""

    DATA = "data"          # a float input: drawn fresh, perturbed by the gate's perturbation check
    INDEX = "index"        # an integer input (ids, offsets, assignments): drawn fresh, never perturbed
    OUTPUT = "output"      # written by the kernel: poisoned before each run (or zeroed: ``zeroed_outputs``)
    STATE = "state"        # read and updated in place (a recurrent state, a KV cache): drawn fresh like an
    #                        input, restored to its drawn value before every checked launch, and compared with
    #                        the oracle's entry of the same name (its value after the kernel)


@dataclass(frozen=True)
class Tensor:
    """One of a problem's tensors: its name (the kernel's gmem parameter of that name), its dtype (the
    parameter must declare exactly this one: a state declared bf16 where the problem says f32 is refused,
    never silently rounded) and its :class:`Role`."""

    name: str
    dtype: str                       # a cake_core.ir.types.DType value: bf16, f16, f32, i32, i64, bool
    role: Role = Role.DATA

    def __post_init__(self) -> None:
        if not str(self.name).isidentifier():
            raise ProblemSpecError(f"tensor name {self.name!r} must be an identifier (it is a kernel parameter)")
        if self.dtype not in _DTYPES:
            raise ProblemSpecError(f"tensor `{self.name}`: dtype {self.dtype!r} is not one of {', '.join(_DTYPES)}")
        object.__setattr__(self, "role", Role(self.role))
        if self.role is Role.INDEX and self.dtype not in ("i32", "i64"):
            raise ProblemSpecError(f"tensor `{self.name}`: an index input is i32 or i64, not {self.dtype}")
        if self.role in (Role.DATA, Role.STATE) and self.dtype in ("i32", "i64", "bool"):
            raise ProblemSpecError(f"tensor `{self.name}`: a {self.role.value} tensor is a float, not {self.dtype}; "
                                   "an integer input is index(...)")


_DTYPES = ("bf16", "f16", "f32", "e4m3", "e5m2", "i32", "i64", "bool")


def data(name: str, dtype: str) -> Tensor:
    """A float input tensor."""
    return Tensor(name, dtype, Role.DATA)


def index(name: str, dtype: str = "i32") -> Tensor:
    """An integer input tensor (never perturbed)."""
    return Tensor(name, dtype, Role.INDEX)


def output(name: str, dtype: str) -> Tensor:
    """An output tensor."""
    return Tensor(name, dtype, Role.OUTPUT)


def state(name: str, dtype: str) -> Tensor:
    """A float tensor the kernel reads and updates in place (an input and an output under one name)."""
    return Tensor(name, dtype, Role.STATE)


@dataclass(frozen=True)
class BenchTarget:
    """What the problem's bench (``bench/corpus_vs_peers.py``) holds its fastest program to: ``speedup`` x the
    fastest of ``peers`` on ``shapes`` (every shape run when empty), a ``geomean`` over every shape run where
    given, or a time within ``floor_slack`` x the weight-read floor (``floor``: a function of the shape, ms at
    the bench machine's bandwidth) where given."""

    shape_set: str                                   # the set the bench runs
    peers: tuple[str, ...] = ()
    speedup: float = 1.0
    shapes: tuple[str, ...] = ()
    geomean: float | None = None
    floor_slack: float | None = None
    floor_bytes: Callable[[dict[str, int]], float] | None = None    # the bytes of the floor floor_slack counts


PeerFactory = Callable[[str, dict[str, Any], "int | None"], Any]     # (problem name, inputs, copies) -> PeerRun


@dataclass(frozen=True)
class Problem:
    """A kernel problem: semantics, tensors, oracle, tolerance, work counts, and the folder that holds its naive
    seed, its hand-written references (``kernels/``) and its shape sets (``shapes/``).

    A problem is defined as ``PROBLEM = Problem(...)`` in a package's ``__init__.py``; ``cake_core.problems.registry``
    finds it (a built-in folder, an installed package's ``cake.problems`` entry point, a ``--problem-path``
    folder) and fills ``root``, ``ref`` and ``source``. A Problem sent to another process (a Ray worker) is
    pickled as its ``ref`` and imported there again (:meth:`__reduce__`)."""

    name: str
    description: str                # the semantics, including the accumulation contract (fp32 or wider)
    dims: tuple[str, ...]
    tensors: tuple[Tensor, ...]     # inputs and outputs, each with its dtype and role
    make_inputs: Callable[[Shape, np.random.Generator], dict[str, np.ndarray]]
    oracle: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]     # fp64 reference
    rtol: float                     # max |out - ref| / max|ref| allowed
    flops: Callable[[Shape], float]
    bytes: Callable[[Shape], float]  # fewest bytes: each input read once, output written once
    seed_file: str                  # the naive seed, under kernels/
    cpu_limit: int = 160            # largest dimension the interpreter checks
    shape_sets: tuple[str, ...] = field(default=())     # under shapes/, the first the default for a small run
    # outputs the kernel accumulates into (atomics): the harness zeroes them before every launch
    # instead of poisoning them; only for a program that reads or adds into them (see zeroed_for)
    zeroed_outputs: tuple[str, ...] = ()
    # a problem-specific comparison (e.g. argmin/top-k allowing ties by distance), called as
    # compare_fn(got, want, rtol); ``want`` is what ``oracle`` returned (it may carry extra
    # `_`-prefixed entries for the comparison)
    compare_fn: Callable[[dict[str, np.ndarray], dict[str, np.ndarray], float], tuple[bool, float, str]] | None = None
    # the oracle on a subset of rows, for headline shapes whose full fp64 oracle is too slow on a CPU
    # (see :class:`RowOracle`); None where the full oracle is cheap enough
    rows: RowOracle | None = None
    # hand-written programs (under kernels/), offered beside the naive seed to a warm run, measured beside
    # every run's best, and part of the corpus gate; they may need shapes the seed does not (e.g. TMA's
    # 16-byte-aligned rows): the verifier says so
    best_files: tuple[str, ...] = ()
    # bump on any change to make_inputs, the oracle or the comparison: cached references carry it in their key
    version: int = 1
    # the `_`-entries of the oracle's result that are the inputs themselves (or rows of them), which the
    # comparison reads: context(inputs, rows) rebuilds them (rows None: the full layout), so a cached
    # reference stores only what the oracle computed
    context: Callable[[dict[str, Any], np.ndarray | None], dict[str, Any]] | None = None
    # what makes a shape meaningless for the problem beyond positive dimensions ('' when nothing), e.g. k > N
    shape_rule: Callable[[Shape], str] | None = None
    # the libraries it is measured against: peer name -> factory (``cake_core.problems.peer``)
    peers: Mapping[str, PeerFactory] = field(default_factory=dict)
    subset_rows: int = 256          # output rows the GPU gate checks on a shape too large for the full oracle
    bench: BenchTarget | None = None
    root: Path | None = None        # the problem's folder (kernels/, shapes/); the registry fills it
    ref: str = ""                   # the importable reference (``module:attr`` or ``path:DIR``); the registry
    source: str = ""                # where it came from: built-in, entry point DIST, path DIR

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names of the tensors drawn before a run (data, index and state), in declaration order."""
        return tuple(t.name for t in self.tensors if t.role is not Role.OUTPUT)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the tensors the kernel writes and the gate compares (outputs and states), in declaration
        order."""
        return tuple(t.name for t in self.tensors if t.role in (Role.OUTPUT, Role.STATE))

    @property
    def states(self) -> tuple[str, ...]:
        """The names of the in/out state tensors (in both ``inputs`` and ``outputs``)."""
        return tuple(t.name for t in self.tensors if t.role is Role.STATE)

    @property
    def params(self) -> tuple[str, ...]:
        """Every tensor's name once, in declaration order: the gmem parameters a kernel of the problem has."""
        return tuple(t.name for t in self.tensors)

    @property
    def perturbed(self) -> str:
        """The input the gate's perturbation check changes: the first float data input (else the first state)."""
        return next((t.name for t in self.tensors if t.role is Role.DATA),
                    next((t.name for t in self.tensors if t.role is Role.STATE), ""))

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def __reduce_ex__(self, protocol: Any):
        """Pickled as its reference (plus any field changed since it was loaded), so that a worker in another
        process imports the problem's own package instead of needing it in a global table."""
        if not self.ref or _registry is None:
            return super().__reduce_ex__(protocol)
        base = _registry.loaded(self.ref)
        changed = {} if base is None else {f.name: getattr(self, f.name) for f in fields(self)
                                           if getattr(self, f.name) is not getattr(base, f.name)}
        return _rebuild_problem, (self.ref, changed)

    def oracle_rows(self, inputs: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        """The oracle for the output rows ``rows`` only (a 1-D index array, see :class:`RowOracle`);
        compare its result with ``compare(take_rows(outputs, rows), ...)``."""
        if self.rows is None:
            raise NotImplementedError(f"problem {self.name} has no row-subset oracle; use the full oracle")
        return self.rows.oracle(inputs, np.asarray(rows, dtype=np.int64))

    def take_rows(self, outputs: dict[str, np.ndarray], rows: np.ndarray,
                  shape: Shape | None = None) -> dict[str, np.ndarray]:
        """The rows ``rows`` of a full output (what a kernel wrote) of ``shape``, in the layout ``oracle_rows``
        gives: the problem's ``take``, else the rows of each output's row view (which needs ``shape``)."""
        if self.rows is None:
            raise NotImplementedError(f"problem {self.name} has no row-subset oracle")
        rows = np.asarray(rows, dtype=np.int64)
        if self.rows.take is not None:
            return self.rows.take(outputs, rows)
        if shape is None:
            raise ValueError(f"problem {self.name} takes rows through its row views: pass the shape")
        return {n: self.rows.view(n, a, shape)[array_module(a).asarray(rows)] for n, a in outputs.items()}

    def row_view(self, name: str, a: Any, shape: Shape) -> Any:
        """Output ``name``'s full array with one RowOracle row per index of its first axis (see RowOracle.views)."""
        if self.rows is None:
            raise NotImplementedError(f"problem {self.name} has no row-subset oracle")
        return self.rows.view(name, a, shape)

    def zeroed_for(self, accumulated: tuple[str, ...] | None) -> tuple[str, ...]:
        """The zeroed outputs that a program accumulating into ``accumulated`` (its gmem parameters read or
        added into, ``ir.zeroing.accumulated_params``; None: unknown) needs zeroed; the others are poisoned."""
        if accumulated is None:
            return self.zeroed_outputs
        return tuple(n for n in self.zeroed_outputs if n in accumulated)

    def param_mismatch(self, names: list[str] | tuple[str, ...], dtypes: Mapping[str, str] | None = None) -> str:
        """What keeps a kernel with gmem parameters ``names`` (of ``dtypes``, name -> dtype value, where known)
        from running on this problem ('' if nothing): every input and output must be a parameter, every
        parameter one of them, and each of the dtype the problem declares."""
        wanted = self.params
        missing = [n for n in wanted if n not in names]
        extra = [n for n in names if n not in wanted]
        parts = ([f"problem `{self.name}` needs parameters {', '.join(missing)}"] if missing else []) + \
                ([f"parameters {', '.join(extra)} are not inputs or outputs of `{self.name}`"] if extra else [])
        for n, dt in (dtypes or {}).items():
            if n in wanted and dt != self.tensor(n).dtype:
                parts.append(f"parameter `{n}` is {dt}, but problem `{self.name}` declares it "
                             f"{self.tensor(n).dtype}; declare gmem[{self.tensor(n).dtype}, ...]")
        return "; ".join(parts)

    def program_mismatch(self, program: Any) -> str:
        """:meth:`param_mismatch` of a parsed program's gmem parameters, names and dtypes."""
        return self.param_mismatch([q.name for q in program.params],
                                   {q.name: q.type.dtype.value for q in program.params})

    @property
    def kernels_dir(self) -> Path:
        """The folder of the naive seed and the hand-written references."""
        if self.root is None:
            raise ProblemSpecError(f"problem `{self.name}` has no folder; load it through cake_core.problems")
        return self.root / KERNELS

    @property
    def shapes_dir(self) -> Path:
        """The folder of the problem's shape sets."""
        if self.root is None:
            raise ProblemSpecError(f"problem `{self.name}` has no folder; load it through cake_core.problems")
        return self.root / SHAPES

    def kernel_text(self, file: str) -> str:
        """The text of ``file`` under the problem's kernels/."""
        return (self.kernels_dir / file).read_text()

    def kernel_files(self) -> list[str]:
        """Every program file under kernels/, the seed and the references first."""
        named = [self.seed_file, *self.best_files]
        return named + sorted(p.name for p in self.kernels_dir.glob("*.cake") if p.name not in named)

    def seed_text(self) -> str:
        return self.kernel_text(self.seed_file)

    def best_texts(self) -> list[str]:
        return [self.kernel_text(f) for f in self.best_files]

    def shape_set(self, name: str) -> ShapeSet:
        return load_shape_set(self, name)

    def shape_error(self, shape: Shape) -> str:
        """What is wrong with ``shape`` for this problem ('' if nothing): a dimension missing or below 1, or
        the problem's own rule (``shape_rule``)."""
        missing = [d for d in self.dims if d not in shape]
        if missing:
            return f"shape {shape_key(shape)} lacks {', '.join(missing)}"
        low = [d for d in self.dims if shape[d] < 1]
        if low:
            return f"shape {shape_key(shape)}: {', '.join(low)} must be ≥ 1"
        return self.shape_rule(shape) if self.shape_rule is not None else ""

    def context_of(self, inputs: dict[str, Any], rows: np.ndarray | None = None) -> dict[str, Any]:
        """The input-derived entries the comparison reads beside a reference (see ``context``)."""
        return {} if self.context is None else self.context(inputs, rows)

    def compare(self, got: dict[str, Any], want: dict[str, Any]) -> tuple[bool, float, str]:
        """(correct, max relative error, message). NaN or an unwritten (poisoned) element fails.

        ``got`` and ``want`` may be numpy or CuPy arrays: on a GPU the comparison runs there and only
        a few scalars come back."""
        if self.compare_fn is not None:
            return self.compare_fn(got, want, self.rtol)
        worst, msg = 0.0, ""
        for name in self.outputs:
            xp = array_module(got[name], want[name])
            g, w = xp.asarray(got[name], dtype=xp.float64), xp.asarray(want[name], dtype=xp.float64)
            if g.shape != w.shape:
                return False, float("inf"), f"{name}: shape {g.shape}, expected {w.shape}"
            bad = ~xp.isfinite(g)
            n_bad = int(bad.sum())
            if n_bad:
                idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad)), g.shape))
                return False, float("inf"), f"{name}: {n_bad} non-finite elements (first at {idx}); unwritten or NaN"
            if not g.size:
                continue
            diff = xp.abs(g - w)
            scale = max(float(xp.abs(w).max()), 1e-30)
            err = float(diff.max()) / scale
            if err > worst:
                worst = err
                idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(diff)), g.shape))
                msg = f"{name}: max rel error {err:.3g} at {idx} (got {float(g[idx]):.6g}, want {float(w[idx]):.6g})"
        return worst <= self.rtol, worst, msg


# cake_core.problems.registry, which sets this when it loads (the package imports it first): a Problem's
# pickling and loading go through it, and this module cannot import it back
_registry: Any = None


def _rebuild_problem(ref: str, changed: dict[str, Any]) -> Problem:
    """A pickled Problem loaded again: the one at ``ref`` with ``changed`` fields replaced."""
    return _registry.rebuild(ref, changed)


def is_shape_file(name: str) -> bool:
    """True when ``name`` is a path to a CSV file rather than the name of a set in a problem's ``shapes/``."""
    return name.endswith(".csv") or "/" in name or os.sep in name


def load_shape_set(problem: Problem, name: str) -> ShapeSet:
    """Read a shape set (columns: the problem's dims, then ``role``).

    ``name`` is a set under the problem's ``shapes/`` folder, or a path to a CSV file, relative or absolute,
    when it ends in ``.csv`` or holds a ``/``.
    """
    folder = problem.shapes_dir
    known = sorted(p.stem for p in folder.glob("*.csv"))
    if is_shape_file(name):
        path = Path(name).expanduser()
        if path.is_dir():
            raise ShapeSetError(f"shape file {path} is a directory; pass the path of a CSV file")
        if not path.is_file():
            raise ShapeSetError(f"no shape file {path} (looked for {path.absolute()}); pass the path of a "
                                f"CSV file, or a set name: {', '.join(known) or 'none'}")
    else:
        path = folder / f"{name}.csv"
        if not path.exists():
            raise ShapeSetError(f"no shape set `{name}` of problem `{problem.name}` (looked for {path}); known: "
                                f"{', '.join(known) or 'none'}; "
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
        if role not in ROLES:
            raise ShapeSetError(f"{path}:{i}: role `{role}` must be headline, tail, held_out or sweep")
        shapes.append(shape)
        roles.append(role)
    return ShapeSet(name, problem.name, tuple(shapes), tuple(roles))
