"""Shape arithmetic that the interpreter, the verifier and the lowering agree on (broadcasts, axes)."""
from __future__ import annotations


def broadcasts_to(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """numpy broadcasting of ``src`` onto ``dst`` without changing ``dst``'s shape."""
    if len(src) > len(dst):
        return False
    return all(s in (d, 1) for s, d in zip(reversed(src), reversed(dst)))


def norm_axis(axis: int, rank: int) -> int | None:
    """``axis`` as a non-negative index of a rank-``rank`` tile, or None if it is not one of its axes."""
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None


def reduced_shapes(shape: tuple[int, ...], axis: int) -> list[tuple[int, ...]]:
    """The shapes a result of reducing ``shape`` along ``axis`` may have: dropped or kept as 1."""
    dropped = shape[:axis] + shape[axis + 1:]
    kept = shape[:axis] + (1,) + shape[axis + 1:]
    return [dropped or (1,), kept]
