"""The gate's expected outputs, computed once per (problem, version, shape, seed, device kind) and cached.

A candidate's correctness check needs the problem's fp64 oracle on the same inputs every other
candidate of the run is checked on: the oracle of a headline cell costs seconds of CPU, so it is
computed once and kept under the Cake home (``<home>/refs``, see :class:`ReferenceCache`). On a GPU
the oracle runs there, in fp64 (the problems' oracles are written over numpy and CuPy alike, and the
H200's fp64 tensor cores make a DGEMM of the largest headline cell take milliseconds), on inputs
drawn on the device; on a CPU it is the numpy oracle.

Layout: ``<root>/<problem>/<digest>/index.json`` (the key, the arrays' dtypes and shapes, when and how
long it took) beside one ``<name>.npy`` per array. An entry is written to a temporary folder and
renamed into place, so concurrent workers never read half an entry; an unreadable entry is a miss.
Entries above ``max_entry_bytes`` are not stored (on a GPU recomputing them is cheaper than reading
them back); the :class:`Reference` says which happened.

The key holds the problem's ``version`` (bumped whenever its inputs, oracle or comparison change)
and ``SEED_SCHEME`` (how the gates seed a shape's inputs: ``problems.base.seed_words``); changing
either leaves old entries unread.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cake_core.problems.base import Problem, Shape, array_module, shape_key, to_host

SEED_SCHEME = 1                  # bump when problems.base.seed_words (or input_sampler) changes
MAX_ENTRY_BYTES = 256 << 20      # larger references are recomputed, not stored


@dataclass(frozen=True)
class RefKey:
    """What a reference depends on. ``rows`` is ``all`` or ``<count>:<digest of the row indices>``."""

    problem: str
    version: int
    shape: str
    seed: int
    device: str
    rows: str = "all"

    def digest(self) -> str:
        text = json.dumps({**asdict(self), "seed_scheme": SEED_SCHEME}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def ref_key(problem: Problem, shape: Shape, seed: int, device: str, rows: np.ndarray | None = None) -> RefKey:
    """The cache key of ``problem``'s reference on ``shape`` (ordered by the problem's dims) under ``seed``."""
    ordered = {d: int(shape[d]) for d in problem.dims}
    sel = "all"
    if rows is not None:
        r = np.ascontiguousarray(rows, dtype=np.int64)
        sel = f"{r.size}:{hashlib.sha256(r.tobytes()).hexdigest()[:16]}"
    return RefKey(problem.name, problem.version, shape_key(ordered), int(seed), device, sel)


class ReferenceCache:
    """References on disk under ``root`` (``<home>/refs``); ``hits``/``misses``/``stored`` count this object's use."""

    def __init__(self, root: str | Path, max_entry_bytes: int = MAX_ENTRY_BYTES):
        self.root = Path(root)
        self.max_entry_bytes = max_entry_bytes
        self.hits = self.misses = self.stored = 0

    def _dir(self, key: RefKey) -> Path:
        return self.root / key.problem / key.digest()

    def load(self, key: RefKey) -> dict[str, np.ndarray] | None:
        """The arrays stored under ``key``, or None (never stored, or unreadable: then it is removed)."""
        d = self._dir(key)
        try:
            index = json.loads((d / "index.json").read_text())
            if index.get("key") != asdict(key):
                raise ValueError("key mismatch")
            out = {name: np.load(d / f"{name}.npy", allow_pickle=False) for name in index["arrays"]}
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError, KeyError, TypeError):   # a damaged entry: recompute it
            shutil.rmtree(d, ignore_errors=True)
            self.misses += 1
            return None
        self.hits += 1
        return out

    def store(self, key: RefKey, arrays: dict[str, np.ndarray], seconds: float = 0.0) -> bool:
        """Store ``arrays`` under ``key``; False when they exceed ``max_entry_bytes`` (nothing stored)."""
        nbytes = sum(int(a.nbytes) for a in arrays.values())
        if nbytes > self.max_entry_bytes:
            return False
        final = self._dir(key)
        tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            for name, a in arrays.items():
                np.save(tmp / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
            index = {"key": asdict(key), "seed_scheme": SEED_SCHEME, "bytes": nbytes, "seconds": round(seconds, 4),
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "arrays": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in arrays.items()}}
            (tmp / "index.json").write_text(json.dumps(index, indent=1))
            try:
                os.rename(tmp, final)
            except OSError:           # another worker stored the same reference first: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return final.is_dir()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.stored += 1
        return True

    def entries(self) -> list[dict[str, Any]]:
        """The index of every stored reference (for inspection and tests)."""
        out = []
        for index in sorted(self.root.glob("*/*/index.json")):
            try:
                out.append(json.loads(index.read_text()))
            except (OSError, ValueError):
                continue
        return out


@dataclass
class Reference:
    """What a check compares against: ``want`` (the oracle's result and its input context) for all rows
    (``rows`` None) or for ``rows`` only; ``source`` says whether it came from the cache."""

    want: dict[str, Any]
    rows: np.ndarray | None
    source: str          # cached | computed | computed, not cached (...) | computed, no cache
    seconds: float
    key: RefKey


def reference(problem: Problem, inputs: dict[str, Any], shape: Shape, seed: int, *, device: str,
              cache: ReferenceCache | None = None, rows: np.ndarray | None = None) -> Reference:
    """The reference of ``problem`` on ``inputs`` (drawn for ``shape`` under ``seed`` on ``device``).

    Parameters
    ----------
    problem, inputs, shape, seed: the inputs must be the gate's draw for (shape, seed), as the key says.
    device: the device kind the inputs were drawn and the oracle runs on (``cpu``, ``cuda:NVIDIA H200``).
    cache: where references are kept; None computes every time.
    rows: a sorted subset of the output rows (see ``problems.base.RowOracle``) for very large shapes.

    Returns a :class:`Reference` on the inputs' array module (numpy or CuPy).
    """
    xp = array_module(*[v for k, v in inputs.items() if not k.startswith("_")])
    rows = None if rows is None else np.asarray(rows, dtype=np.int64)
    key = ref_key(problem, shape, seed, device, rows)
    ctx = problem.context_of(inputs, rows)
    t0 = time.perf_counter()
    stored = cache.load(key) if cache is not None else None
    if stored is not None:
        want = {k: xp.asarray(v) for k, v in stored.items()}
        return Reference({**want, **ctx}, rows, "cached", time.perf_counter() - t0, key)
    full = problem.oracle(inputs) if rows is None else problem.oracle_rows(inputs, rows)
    computed = {k: v for k, v in full.items() if k not in ctx}
    seconds = time.perf_counter() - t0
    if cache is None:
        source = "computed, no cache"
    else:
        host = {k: to_host(v) for k, v in computed.items()}
        nbytes = sum(int(a.nbytes) for a in host.values())
        source = ("computed" if cache.store(key, host, seconds) else
                  f"computed, not cached ({nbytes >> 20} MiB over the {cache.max_entry_bytes >> 20} MiB cap)")
    return Reference({**computed, **ctx}, rows, source, seconds, key)


def problem_fingerprint(problem: Problem, shape: Shape | None = None, seed: int = 0) -> str:
    """A digest of what ``problem`` draws and computes on a small shape (numpy, values rounded to float32):
    it changes when its inputs or its oracle do, which is when ``Problem.version`` must be bumped."""
    from cake_core.problems.base import input_sampler  # noqa: PLC0415 - keeps the import list short above

    small = shape or {d: 5 + i for i, d in enumerate(problem.dims)}
    if "k" in small:
        small = {**small, "k": min(small["k"], min(v for d, v in small.items() if d != "k"))}
    inputs = problem.make_inputs(small, input_sampler(seed, small))
    h = hashlib.sha256()
    for part in (inputs, problem.oracle(inputs)):
        for name in sorted(part):
            a = np.asarray(to_host(part[name]))
            a = a.astype(np.float32) if a.dtype.kind == "f" else a.astype(np.int64)
            h.update(name.encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:16]
