"""The figures of ``cake report``, drawn with matplotlib (Agg: no display needed) from ``tasks.results`` rows.

Each function writes one PNG and returns its path, or returns None when the run has nothing to draw there
(the report then says why in words): a run without a GPU has no measured time, a run without failures no
failure clusters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

DPI = 110
TOP_CLUSTERS = 7        # clusters drawn apart; the rest are summed as "other"


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _generation_ticks(ax: Any, gens: list[int]) -> None:
    """Whole generations on the x axis (every one while they are few)."""
    if len(gens) <= 20:
        ax.set_xticks(gens)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def best_over_generations(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """The best predicted and the best measured geomean so far per generation (``convergence_rows``)."""
    pred = [(r["generation"], r["predicted_so_far_ms"]) for r in rows if r["predicted_so_far_ms"]]
    meas = [(r["generation"], r["measured_so_far_ms"]) for r in rows if r["measured_so_far_ms"]]
    if not pred and not meas:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for pts, label, style in ((pred, "predicted (cost model)", "--"), (meas, "measured (GPU median)", "-")):
        if pts:
            ax.step(*zip(*pts), style, where="post", marker="o", label=label)
    ax.set_yscale("log")
    _generation_ticks(ax, sorted({g for g, _ in pred + meas}))
    ax.set_xlabel("generation")
    ax.set_ylabel("best geomean so far (ms)")
    ax.set_title("Best kernel over generations" + ("" if meas else " (not timed: predicted only)"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def speedup_per_shape(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """The run's speed-up per shape over the fastest hand-written kernel and the peer (``shape_rows``)."""
    rows = [r for r in rows if r["vs_hand_written"] or r["vs_peer"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
    xs = range(len(rows))
    w = 0.38
    hw = [r["vs_hand_written"] or 0.0 for r in rows]
    peer = [r["vs_peer"] or 0.0 for r in rows]
    series = [(ys, label) for ys, label in ((hw, "vs hand-written best"), (peer, "vs peer")) if any(ys)]
    for k, (ys, label) in enumerate(series):     # a source with no figure (no peer on a CPU) is left out
        ax.bar([x + (k - (len(series) - 1) / 2) * w for x in xs], ys, w, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["shape"] + (" (held out)" if r["role"] == "held_out" else "") for r in rows],
                       rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("speed-up of the run (above 1: faster)")
    basis = {r["run_basis"] for r in rows}
    ax.set_title("Speed-up per shape" + (" (predicted: not timed)" if basis == {"predicted"} else ""))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def failure_clusters(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Failed attempts per generation, stacked by cluster (``failure_rows``)."""
    if not rows:
        return None
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["cluster"]] = totals.get(r["cluster"], 0) + r["n"]
    top = sorted(totals, key=lambda c: (-totals[c], c))[:TOP_CLUSTERS]
    gens = sorted({r["generation"] for r in rows})
    series = {c: [0] * len(gens) for c in top + ["other"]}
    for r in rows:
        c = r["cluster"] if r["cluster"] in top else "other"
        series[c][gens.index(r["generation"])] += r["n"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = [0] * len(gens)
    for c, ys in series.items():
        if any(ys):
            ax.bar(gens, ys, bottom=bottom, label=c)
            bottom = [b + y for b, y in zip(bottom, ys)]
    _generation_ticks(ax, gens)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("generation")
    ax.set_ylabel("failed attempts")
    ax.set_title("Failure clusters over time")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def predicted_vs_measured(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Every (kernel, shape) predicted and measured, log-log, beside the line of a perfect model."""
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for kind in sorted({r["kind"] for r in rows}):
        pts = [(r["measured_ms"], r["predicted_ms"]) for r in rows if r["kind"] == kind]
        ax.scatter(*zip(*pts), s=12, alpha=0.6, label=kind)
    lo = min(min(r["measured_ms"], r["predicted_ms"]) for r in rows)
    hi = max(max(r["measured_ms"], r["predicted_ms"]) for r in rows)
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured median (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title("Cost model: predicted against measured")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def portfolio_speedup(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """A portfolio's rows (``tasks.portfolio.portfolio_report``): peer / ours against each row's work (flops), log
    scales, searched and held-out rows apart; None when no row has both figures."""
    rows = [r for r in rows if r["speedup"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for role, marker, label in (("searched", "o", "searched rows"), ("held_out", "^", "held-out rows")):
        pick = [r for r in rows if (r["role"] == "held_out") == (role == "held_out")]
        if pick:
            ax.scatter([max(r["flops"], 1.0) for r in pick], [r["speedup"] for r in pick], marker=marker,
                       label=f"{label} ({len(pick)})", alpha=0.75)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("work of the row (flops)")
    ax.set_ylabel("speed-up over the fastest peer (above 1: faster)")
    ax.set_title("Speed-up per portfolio row")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)
