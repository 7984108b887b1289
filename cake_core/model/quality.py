"""How good the cost model is, measured on (predicted, measured) pairs rather than assumed.

``rank_correlation`` is Spearman's rho between predicted and measured times;
``best_survives`` is the fraction of groups (one group = the candidates of one
generation on one shape) whose truly fastest candidate the filter would keep
among its top ``k`` predictions.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Sequence


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2.0       # ties share their mean rank
        i = j + 1
    return ranks


def rank_correlation(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Spearman's rho; None with fewer than 3 pairs or no spread."""
    if len(predicted) != len(measured) or len(predicted) < 3:
        return None
    rp, rm = _ranks(predicted), _ranks(measured)
    mp, mm = sum(rp) / len(rp), sum(rm) / len(rm)
    cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
    sp = math.sqrt(sum((a - mp) ** 2 for a in rp))
    sm = math.sqrt(sum((b - mm) ** 2 for b in rm))
    return cov / (sp * sm) if sp and sm else None


def best_survives(rows: Sequence[tuple[Hashable, float, float]], k: int) -> float | None:
    """rows: (group, predicted, measured). Fraction of groups whose fastest measured candidate
    is among the ``k`` lowest predictions of its group."""
    groups: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
    for g, p, m in rows:
        groups[g].append((p, m))
    scored = [g for g in groups.values() if len(g) > 1]
    if not scored:
        return None
    hits = 0
    for g in scored:
        best = min(range(len(g)), key=lambda i: g[i][1])
        top = sorted(range(len(g)), key=lambda i: g[i][0])[:k]
        hits += best in top
    return hits / len(scored)


def median_abs_log_error(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    errs = sorted(abs(math.log(p / m)) for p, m in zip(predicted, measured) if p > 0 and m > 0)
    return errs[len(errs) // 2] if errs else None
