"""Large GPU-test shapes checked as the corpus bench checks them: on random output rows against the
oracle of those rows alone (``problems.row_subset.row_subset_problem``), with the perturbation check; the full fp64
oracle of a headline shape takes minutes of CPU on the GPU machine."""
from __future__ import annotations

from cake_core.problems.row_subset import pick_rows, row_subset_problem


def on_rows(problem, shape: dict, n: int = 256, seed: int = 1):
    """``problem`` restricted to ``n`` random output rows of ``shape`` (points, queries, C rows)."""
    return row_subset_problem(problem, pick_rows(problem, shape, n, seed))
