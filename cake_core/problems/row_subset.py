"""Checking a large shape on a subset of its output rows: the full fp64 oracle of a headline shape takes
minutes of CPU, the oracle of a few hundred rows (``RowOracle``) does not.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cake_core.errors import CakeError


def pick_rows(problem, shape: dict, n: int, seed: int) -> np.ndarray:
    """``n`` distinct rows (see ``RowOracle``) of ``shape``, sorted, drawn with ``seed``."""
    count = problem.rows.count(shape)
    return np.sort(np.random.default_rng(seed).choice(count, size=min(n, count), replace=False)).astype(np.int64)


def row_subset_problem(problem, rows: np.ndarray):
    """``problem`` with its oracle and comparison restricted to ``rows`` (for shapes whose full fp64
    oracle is too slow on a CPU), usable by ``check_and_time`` unchanged.

    The oracle returns ``oracle_rows`` for ``rows`` plus the rows fed by any element of the first input
    that differs from the first inputs it saw (so the perturbation run checks the row it perturbed),
    under ``_sub``/``_sel``; the output entries themselves are NaN scalars, which makes the runtime's
    "did the output move with the oracle" test vacuous: the perturbed row's correctness is what
    checks that the kernel read the new input. The comparison cuts the same rows out of the output.
    """
    if problem.rows is None:
        raise CakeError(f"problem {problem.name} has no row-subset oracle")
    rows = np.unique(np.asarray(rows, np.int64))
    first: dict[str, np.ndarray] = {}
    name0 = problem.inputs[0]

    def oracle(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sel = rows
        if name0 not in first:
            first[name0] = inputs[name0]
        elif inputs[name0] is not first[name0]:
            diff = np.flatnonzero(np.asarray(inputs[name0]).reshape(-1) != np.asarray(first[name0]).reshape(-1))
            if diff.size:
                sel = np.union1d(rows, problem.rows.rows_of_input0(inputs, diff))
        return {**{n: np.float64("nan") for n in problem.outputs}, "_sel": sel,
                "_sub": problem.oracle_rows(inputs, sel)}

    def compare_fn(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> tuple[bool, float, str]:
        ok, err, msg = problem.compare(problem.take_rows(got, want["_sel"]), want["_sub"])
        return ok, err, (msg + f" [on {len(want['_sel'])} rows]" if msg else msg)

    return dataclasses.replace(problem, oracle=oracle, compare_fn=compare_fn)
