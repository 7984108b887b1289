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


# ---------------------------------------------------------------- within-group figures
# rows: (group, predicted, measured) where ``predicted`` orders like time (lower: predicted faster).


def _keyed_groups(rows: Sequence[tuple[Hashable, float, float]], min_size: int
                  ) -> dict[Hashable, list[tuple[float, float]]]:
    groups: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
    for g, p, m in rows:
        groups[g].append((p, m))
    return {k: v for k, v in groups.items() if len(v) >= min_size}


def _groups(rows: Sequence[tuple[Hashable, float, float]], min_size: int) -> list[list[tuple[float, float]]]:
    return list(_keyed_groups(rows, min_size).values())


def within_group_spearman(rows: Sequence[tuple[Hashable, float, float]], min_size: int = 3
                          ) -> tuple[float | None, int]:
    """Mean Spearman rho over groups of ``min_size`` or more candidates (pooling groups would mix shape sizes);
    returns (mean rho or None, number of groups that had a rho)."""
    rhos = [r for g in _groups(rows, min_size)
            if (r := rank_correlation([p for p, _ in g], [m for _, m in g])) is not None]
    return (sum(rhos) / len(rhos) if rhos else None), len(rhos)


def top1_hit_rate(rows: Sequence[tuple[Hashable, float, float]]) -> float | None:
    """Fraction of groups (2+ candidates) whose lowest prediction is the measured fastest."""
    groups = _groups(rows, 2)
    if not groups:
        return None
    hits = sum(min(range(len(g)), key=lambda i: (g[i][0], i)) == min(range(len(g)), key=lambda i: g[i][1])
               for g in groups)
    return hits / len(groups)


def best_survivors(rows: Sequence[tuple[Hashable, float, float]], keep: float = 0.5) -> dict[Hashable, bool]:
    """Per group (2+ candidates): whether its measured fastest is among the ``ceil(keep * n)`` lowest
    predictions (the filter's keep share, exploration left out)."""
    out = {}
    for key, g in _keyed_groups(rows, 2).items():
        k = max(1, math.ceil(keep * len(g)))
        best = min(range(len(g)), key=lambda i: g[i][1])
        out[key] = best in sorted(range(len(g)), key=lambda i: (g[i][0], i))[:k]
    return out


def best_survives_fraction(rows: Sequence[tuple[Hashable, float, float]], keep: float = 0.5) -> float | None:
    """Fraction of groups (2+ candidates) whose measured fastest survives (``best_survivors``)."""
    kept = best_survivors(rows, keep)
    return sum(kept.values()) / len(kept) if kept else None


def sign_test_p(worse: int, better: int) -> float:
    """One-sided sign test: the chance of ``worse`` or more of ``worse + better`` discordant pairs going one
    way if each went either way at even odds (1.0 with no discordant pair)."""
    n = worse + better
    return sum(math.comb(n, i) for i in range(worse, n + 1)) / 2 ** n if n else 1.0


def median_error_factor(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """exp(median |log(predicted / measured)|): 1.0 is exact, 2.0 is typically off by 2x either way."""
    e = median_abs_log_error(predicted, measured)
    return math.exp(e) if e is not None else None
