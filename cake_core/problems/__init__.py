"""Kernel problems: the interface (:mod:`.base`: a problem's spec; :mod:`.registry`: finding them) and the
built-in problem packages, one folder each (spec, naive seed, hand-written references, shape sets, peers,
bench target). Nothing outside a problem's folder names it."""
from __future__ import annotations

from cake_core.problems.base import (BenchTarget, Problem, ProblemSpecError, Role, Shape, ShapeSet, ShapeSetError,
                                     Tensor, UnknownProblem, data, index, load_shape_set, output, shape_key, state)
from cake_core.problems.registry import (ENTRY_POINT_GROUP, Broken, catalogue, find_problem, get_problem,
                                         list_problems, use_problem_paths)


def corpus_file(file: str):
    """The path of kernel file ``file`` (``kernels/`` of whichever problem holds it)."""
    for p in list_problems():
        path = p.kernels_dir / file
        if path.is_file():
            return path
    raise FileNotFoundError(f"no problem's kernels/ holds {file}")


def corpus_files(pattern: str = "*.cake"):
    """Every kernel file of every problem whose name matches ``pattern``, sorted by file name."""
    return sorted((f for p in list_problems() for f in p.kernels_dir.glob(pattern)), key=lambda f: f.name)


__all__ = ["BenchTarget", "Broken", "ENTRY_POINT_GROUP", "Problem", "ProblemSpecError", "Role", "Shape", "ShapeSet",
           "ShapeSetError", "Tensor", "UnknownProblem", "catalogue", "corpus_file", "corpus_files", "data", "find_problem", "get_problem", "index",
           "list_problems", "load_shape_set", "output", "shape_key", "state", "use_problem_paths"]
