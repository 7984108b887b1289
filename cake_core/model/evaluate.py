"""How good a cost model is on measurements it was not fitted on, and which model a run should use.

Cells: the candidates of one (run, problem, shape, GPU, timer) -- what one filter decision compares.
A program measured twice in a cell counts once (median). Figures, per problem and overall:

- within-shape Spearman: mean rank correlation of score and measured time over cells of 3+ programs (every
  cell counts once: a cell of 3 hand-written variants, where rho takes four values, as much as an evolution
  generation of 80), and apart over the cells of ``LARGE_CELL``+ programs, which come from evolution runs;
- top-1 hit rate: cells (2+ programs) whose best-scored program is the measured fastest;
- best survives: cells whose measured fastest is among the ``ceil(keep * n)`` best-scored;
- median error factor: exp(median |log(predicted / measured)|) over the held-out samples.

Held-out splits never cut one run's rows apart: ``run`` is leave-one-run-out cross validation (each run
is predicted by a model fitted on the others), ``time`` fits on the earlier runs and predicts the latest
``TIME_HOLDOUT`` of them. A training set never holds a (program, shape) that its test run measured,
so a kernel timed in two runs is not graded on its own measurement. The analytic model as shipped is
not fitted on anything: it is graded on every sample.

``compare`` decides whether the learned model replaces the analytic one: on the cells both graded, a
higher within-shape Spearman, and no cells lost the measured best to it beyond chance -- of the cells where
one model keeps the best and the other drops it, the learned model's drops are not significantly more than
its keeps (one-sided sign test, ``SURVIVAL_ALPHA``), so one cell of 150 does not decide; overall, and for each
problem on its own cells (a run of that problem uses the learned model where it won there).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, Sequence

from cake_core.model.base import CostModelBase, NotEnoughData, Sample
from cake_core.model.quality import (best_survives_fraction, best_survivors, median_error_factor, sign_test_p,
                                     top1_hit_rate, within_group_spearman)

SPLITS = ("run", "time")
TIME_HOLDOUT = 0.3
LARGE_CELL = 10             # programs in a cell for its Spearman to count among the large cells
KEEP = 0.5                  # the flow keeps half a generation (plus exploration)
SURVIVAL_ALPHA = 0.05       # the sign test's level for "the learned model drops the best more often"


@dataclass(frozen=True)
class Scored:
    sample: Sample
    score: float            # higher: predicted faster
    predicted_ms: float
    fold: str


def dedupe(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per (cell, program): the median of its measurements."""
    by: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.measured_ms and s.measured_ms > 0:
            by[(s.group, s.program.hash)].append(s)
    out = []
    for group in by.values():
        s = group[0]
        out.append(Sample(s.program, s.shape, s.gpu, s.problem, s.resources, median(x.measured_ms for x in group),
                          s.run_id, s.attempt_id, s.timer, s.meta))
    return out


def folds(samples: Sequence[Sample], split: str) -> list[tuple[str, list[Sample], list[Sample]]]:
    """(name, train, test) per fold; see the module docstring."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    runs = sorted({s.run_id for s in samples})
    if split == "run":
        tests = [[r] for r in runs]
    else:
        started = {s.run_id: dict(s.meta).get("started_at", "") for s in samples}
        ordered = sorted(runs, key=lambda r: (str(started.get(r, "")), r))
        n = max(1, math.ceil(TIME_HOLDOUT * len(ordered)))
        tests = [ordered[-n:]] if len(ordered) > 1 else []
    out = []
    for test_runs in tests:
        test = [s for s in samples if s.run_id in test_runs]
        seen = {(s.program.hash, s.shape_key, s.problem) for s in test}
        train = [s for s in samples if s.run_id not in test_runs and (s.program.hash, s.shape_key, s.problem) not in seen]
        out.append(("+".join(test_runs), train, test))
    return out


def grade(model: CostModelBase, samples: Sequence[Sample], fold: str = "all") -> list[Scored]:
    if not samples:
        return []
    ms, sc = model.predict(samples), model.score(samples)
    return [Scored(s, float(c), float(m), fold) for s, m, c in zip(samples, ms, sc)]


def held_out(fit: Callable[[list[Sample]], CostModelBase], samples: Sequence[Sample], split: str
             ) -> tuple[list[Scored], list[str]]:
    """Grade a model fitted per fold (``fit(train)``); returns the held-out rows and a note per fold that
    could not be fitted (its test samples are then not graded)."""
    rows, notes = [], []
    for name, train, test in folds(samples, split):
        try:
            model = fit(train)
        except NotEnoughData as e:
            notes.append(f"{name}: not fitted ({e})")
            continue
        rows += grade(model, test, name)
    return rows, notes


def figures(rows: Sequence[Scored], keep: float = KEEP) -> dict[str, Any]:
    """The four figures over ``rows`` (see the module docstring) and the counts behind them."""
    cells = _cells(rows)
    rho, n_rho = within_group_spearman(cells)
    rho_large, n_large = within_group_spearman(cells, LARGE_CELL)
    ncell = defaultdict(int)
    for g, _, _ in cells:
        ncell[g] += 1
    return {"samples": len(rows), "cells": sum(1 for v in ncell.values() if v >= 2), "spearman_cells": n_rho,
            "spearman": rho, "spearman_large": rho_large, "spearman_large_cells": n_large,
            "top1": top1_hit_rate(cells), "best_survives": best_survives_fraction(cells, keep),
            "error_factor": median_error_factor([r.predicted_ms for r in rows], [r.sample.measured_ms for r in rows])}


def report(rows: Sequence[Scored], keep: float = KEEP) -> dict[str, dict[str, Any]]:
    """``figures`` per problem, and ``overall``."""
    by: dict[str, list[Scored]] = defaultdict(list)
    for r in rows:
        by[r.sample.problem].append(r)
    out = {p: figures(v, keep) for p, v in sorted(by.items())}
    out["overall"] = figures(rows, keep)
    return out


def _cells(rows: Sequence[Scored]) -> list[tuple[Any, float, float]]:
    return [(r.sample.group, -r.score, r.sample.measured_ms) for r in rows]


def _verdict(analytic: Sequence[Scored], learned: Sequence[Scored], keep: float) -> dict[str, Any]:
    both = {r.sample.group for r in learned} & {r.sample.group for r in analytic}
    analytic = [r for r in analytic if r.sample.group in both]
    learned = [r for r in learned if r.sample.group in both]
    a, b = figures(analytic, keep), figures(learned, keep)
    sa, sb = best_survivors(_cells(analytic), keep), best_survivors(_cells(learned), keep)
    lost = sum(1 for g, kept in sa.items() if kept and not sb.get(g, False))
    saved = sum(1 for g, kept in sb.items() if kept and not sa.get(g, False))
    p = sign_test_p(lost, saved)
    wins = (a["spearman"] is not None and b["spearman"] is not None and b["spearman"] > a["spearman"]
            and p >= SURVIVAL_ALPHA)
    fmt = (lambda x: "-" if x is None else f"{x:.3f}")
    summary = (f"held-out cells {b['cells']}: within-shape Spearman learned {fmt(b['spearman'])} vs analytic "
               f"{fmt(a['spearman'])}, best survives {fmt(b['best_survives'])} vs {fmt(a['best_survives'])} "
               f"(learned drops it in {lost} cells the analytic keeps, keeps it in {saved} the analytic drops"
               f"{f'; sign test p={p:.3f}' if lost > saved else ''})")
    return {"learned_wins": bool(wins), "analytic": a, "learned": b, "summary": summary,
            "best_lost": lost, "best_saved": saved, "survival_p": p}


def compare(analytic: Sequence[Scored], learned: Sequence[Scored], keep: float = KEEP) -> dict[str, Any]:
    """Whether the learned rows beat the analytic ones on the cells both graded (module docstring), overall and
    per problem: a run ranks one problem's candidates, so the learned model may serve the problems where it
    won on held-out data and leave the analytic model to the others (``per_problem``, ``problems_won``)."""
    out = _verdict(analytic, learned, keep)
    per = {}
    for prob in sorted({r.sample.problem for r in learned} & {r.sample.problem for r in analytic}):
        v = _verdict([r for r in analytic if r.sample.problem == prob], [r for r in learned if r.sample.problem == prob],
                     keep)
        per[prob] = {k: v[k] for k in ("learned_wins", "summary", "best_lost", "best_saved", "survival_p")}
    out["per_problem"] = per
    out["problems_won"] = [p for p, v in per.items() if v["learned_wins"]]
    return out


def samples_from_rows(rows: Sequence[dict[str, Any]], gpu: str) -> tuple[list[Sample], list[str]]:
    """Samples from warehouse rows (attempt_id, run_id, problem, ir_text, shape, timer, median_ms, started_at,
    registers, spill_bytes, smem_bytes); returns them and a line per attempt whose text does not parse."""
    from cake_core.ir.text import parse

    programs: dict[str, Any] = {}
    bad: list[str] = []
    out = []
    for r in rows:
        text = r["ir_text"]
        if text not in programs:
            parsed = parse(text, "attempt.cake")
            p = programs[text] = parsed.program if parsed.ok else None
            if p is None:      # a recovered program with parse errors lacks the statements that failed
                bad.append(f"attempt {r['attempt_id']}: its IR text does not parse today; left out")
        prog = programs[text]
        if prog is None:
            continue
        shape = {k: int(v) for k, v in (kv.split("=") for kv in r["shape"].split(","))}
        res = {k: r[k] for k in ("registers", "spill_bytes", "smem_bytes") if r.get(k) is not None}
        out.append(Sample.of(prog, shape, gpu, res or None, problem=r["problem"], measured_ms=float(r["median_ms"]),
                             run_id=r["run_id"], attempt_id=r["attempt_id"], timer=r.get("timer") or "cuda_event",
                             meta=(("started_at", str(r.get("started_at") or "")),)))
    return out, bad
