"""The kernel corpus: every problem Cake knows, by name."""
from __future__ import annotations

from cake_core.problems.base import (Problem, Shape, ShapeSet, ShapeSetError, UnknownProblem,
                                     load_shape_set, shape_key)
from cake_core.problems.gemm import GEMM_BF16
from cake_core.problems.kmeans_assign import KMEANS_ASSIGN
from cake_core.problems.kmeans_update import KMEANS_UPDATE
from cake_core.problems.knn_topk import KNN_TOPK
from cake_core.problems.tinygemm import TINYGEMM

PROBLEMS: dict[str, Problem] = {p.name: p for p in (GEMM_BF16, KMEANS_ASSIGN, KMEANS_UPDATE, KNN_TOPK,
                                                      TINYGEMM)}


def list_problems() -> list[Problem]:
    return list(PROBLEMS.values())


def get_problem(name: str) -> Problem:
    try:
        return PROBLEMS[name]
    except KeyError:
        raise UnknownProblem(f"unknown problem `{name}`; known: {', '.join(PROBLEMS)} "
                             "(`cake problems` lists them)") from None


__all__ = ["Problem", "Shape", "ShapeSet", "ShapeSetError", "UnknownProblem", "get_problem",
           "list_problems", "load_shape_set", "shape_key", "PROBLEMS"]
