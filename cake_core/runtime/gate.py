"""The correctness gate's steps, shared by the CPU (interpreter) and GPU (CuPy) backends.

Both backends run the same protocol on their own array module (numpy or CuPy: the arrays decide):

1. draw the shape's inputs from ``input_sampler(seed, shape)`` (fresh random values, never zeros);
2. take the reference from ``references.reference`` (computed once per problem, version, shape, seed
   and device kind; cached under the Cake home), for every output row or a subset of rows;
3. run the kernel into poisoned outputs and compare (:func:`compare_to`): all of them, or the subset;
4. perturb one element of the first input and run again (:func:`perturbation_check`): only the rows
   that element feeds are recomputed (``RowOracle.rows_of_perturbed``, of ``Problem.perturbed``); they must match the perturbed
   oracle and must have changed where the oracle did, and every other row must still match the
   unperturbed reference (so a kernel that caches a result from its first run fails).

What each shape got is recorded (:class:`CheckInfo`) so that a run can say it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cake_core.problems.base import Problem, Shape, array_module, bf16_round, parse_shape_key
from cake_core.runtime.references import Reference

PERTURB_STREAM = 1     # the perturbation's element is drawn from its own stream of the shape's seed
PERTURB_TRIES = 8      # elements tried for one whose change moves the expected output


@dataclass(frozen=True)
class CheckInfo:
    """Which check a shape got: ``check`` full | rows; ``rows`` output rows compared; ``perturbed`` the
    element changed and the rows recomputed for it ('' when the check stopped before); ``reference``
    where the expected outputs came from (cached, computed...)."""

    check: str = "full"
    rows: int = 0
    perturbed: str = ""
    reference: str = ""

    def describe(self) -> str:
        parts = [f"{self.check} ({self.rows} rows)"]
        if self.perturbed:
            parts.append(f"perturbation {self.perturbed}")
        if self.reference:
            parts.append(f"reference {self.reference}")
        return "; ".join(parts)


def info_for(problem: Problem, shape: Shape, ref: Reference, perturbed: str = "") -> CheckInfo:
    count = problem.rows.count(shape) if problem.rows is not None else 0
    if ref.rows is None:
        return CheckInfo("full", count, perturbed, ref.source)
    return CheckInfo("rows", int(ref.rows.size), perturbed, ref.source)


def compare_to(problem: Problem, got: dict[str, Any], ref: Reference) -> tuple[bool, float, str]:
    """``got`` (a whole output) against ``ref``: every row, or ``ref.rows`` only."""
    if ref.rows is None:
        return problem.compare(got, ref.want)
    shape = parse_shape_key(ref.key.shape, problem.dims)
    ok, err, msg = problem.compare(problem.take_rows(got, ref.rows, shape), ref.want)
    return ok, err, (f"{msg} [on {ref.rows.size} rows]" if msg else msg)


def pick_rows(problem: Problem, shape: Shape, n: int, seed: int) -> np.ndarray:
    """``n`` distinct output rows (see ``RowOracle``) of ``shape``, sorted, drawn with ``seed``."""
    if problem.rows is None:
        raise ValueError(f"problem {problem.name} has no row-subset oracle")
    count = problem.rows.count(shape)
    return np.sort(np.random.default_rng(seed).choice(count, size=min(n, count), replace=False)).astype(np.int64)


def perturbed_inputs(problem: Problem, inputs: dict[str, Any], flat: int, bf16: bool) -> dict[str, Any]:
    """``inputs`` with element ``flat`` of the perturbed input (``Problem.perturbed``, the first float input) moved
    by 4 + 2|v| (far past the tolerance, away from zero; rounded to bf16 when the kernel reads bf16). A copy: the
    original stays as it was."""
    name = problem.perturbed
    x = inputs[name].copy()
    view = x.reshape(-1)
    v = float(view[flat])
    delta = 4.0 + 2.0 * abs(v)
    new = np.float32(v + delta if v >= 0 else v - delta)
    if bf16:
        new = bf16_round(np.array([new], dtype=np.float32))[0]
    view[flat] = new
    return {**inputs, name: x}


def _moved(problem: Problem, w0: Any, w1: Any) -> Any:
    """Where the expected output moved by more than the tolerance could hide (10 rtol of its scale)."""
    xp = array_module(w0, w1)
    a, b = xp.asarray(w0, xp.float64), xp.asarray(w1, xp.float64)
    scale = max(float(xp.abs(a).max()) if a.size else 0.0, 1e-30)
    return xp.abs(b - a) > 10 * problem.rtol * scale


def _splice(problem: Problem, shape: Shape, into: dict[str, Any], src: dict[str, Any],
            rows: np.ndarray) -> dict[str, Any]:
    """A copy of ``into`` whose output rows ``rows`` are those of ``src``."""
    out = {}
    for n, a in into.items():
        xp = array_module(a)
        b = a.copy()
        problem.row_view(n, b, shape)[xp.asarray(rows)] = problem.row_view(n, src[n], shape)[xp.asarray(rows)]
        out[n] = b
    return out


def perturbation_check(problem: Problem, shape: Shape, inputs: dict[str, Any], got: dict[str, Any],
                       ref: Reference, run: Callable[[dict[str, Any]], dict[str, Any]], seed_words: list[int],
                       bf16: bool) -> tuple[bool, float, str, str]:
    """Perturb one element of the perturbed input (``Problem.perturbed``), run again, check incrementally.

    ``got`` is the (correct) output of the first run; ``run(inputs)`` runs the kernel on new inputs into
    poisoned outputs. The element is the first of a few seeded draws whose change moves the expected
    output (so that replaying the first output fails). Returns (ok, max error, message, what was
    perturbed). Without a row oracle the perturbed output is checked against the whole oracle, recomputed.
    """
    name = problem.perturbed
    size = int(np.prod(inputs[name].shape))
    draw = np.random.default_rng([*seed_words, PERTURB_STREAM])
    if problem.rows is None or problem.rows.rows_of_perturbed is None:   # the whole oracle again
        flat = int(draw.integers(size))
        p_inputs = perturbed_inputs(problem, inputs, flat, bf16)
        ok, err, msg = problem.compare(run(p_inputs), problem.oracle(p_inputs))
        what = f"{name}[{flat}], whole oracle recomputed"
        return ok, err, ("" if ok else f"after perturbing {name}[{flat}]: {msg}"), what
    # an element whose change moves the expected output (an argmin may stay put): a few draws, one row each
    for _ in range(PERTURB_TRIES):
        flat = int(draw.integers(size))
        p_inputs = perturbed_inputs(problem, inputs, flat, bf16)
        fed = problem.rows.rows_of_perturbed(p_inputs, np.array([flat]))
        old, new = problem.oracle_rows(inputs, fed), problem.oracle_rows(p_inputs, fed)
        moved = {n: _moved(problem, old[n], new[n]) for n in problem.outputs}
        if any(int(m.sum()) for m in moved.values()):
            break
    what = f"{name}[{flat}], {fed.size} row{'s' if fed.size != 1 else ''} recomputed"
    p_got = run(p_inputs)
    ok, err, msg = problem.compare(problem.take_rows(p_got, fed, shape), new)
    if not ok:
        return False, err, f"after perturbing {name}[{flat}], on the rows it feeds: {msg}", what
    # the rest of the output: the perturbation does not reach it, so the unperturbed reference holds there
    ok2, err2, msg2 = compare_to(problem, _splice(problem, shape, p_got, got, fed), ref)
    if not ok2:
        return False, err2, f"after perturbing {name}[{flat}], on the rows it does not feed: {msg2}", what
    before, after = problem.take_rows(got, fed, shape), problem.take_rows(p_got, fed, shape)
    for n in problem.outputs:
        xp = array_module(before[n])
        n_moved = int(moved[n].sum())
        if n_moved and bool(xp.all(xp.asarray(before[n])[moved[n]] == xp.asarray(after[n])[moved[n]])):
            return False, err, (f"{n}: output did not change after perturbing {name}[{flat}] although the oracle "
                                f"did ({n_moved} elements)"), what
    return True, max(err, err2), "", what
