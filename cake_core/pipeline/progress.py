"""Where a run stands, as its warehouse rows say: the one picture of a run's progress that the flow's summary,
the live display of ``cake evolve`` and the end of a run share.

:class:`RunProgress` holds what the warehouse's views say (attempts by generation and outcome, the best so far
from ``run_best``, the baselines from ``baseline_scores``, and once the run ended its held-out report and the
winners that failed their confirmation); it is built from the rows of ``warehouse.queries.progress_rows`` and
computes nothing the views define. The select stage's :class:`~cake_core.pipeline.state.RunState` is another
thing: what the agent sees next, rebuilt from the rows of finished generations only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASSED = ("checked", "measured")     # outcomes of a kernel that passed its correctness check


@dataclass
class RunProgress:
    """A run's progress: attempts by (generation, outcome), the best so far, the baselines, the final report."""

    run_id: str
    counts: dict[tuple[int, str], int] = field(default_factory=dict)
    predicted: dict[int, float] = field(default_factory=dict)    # generation -> best predicted ms that passed
    best: dict[str, Any] | None = None         # the run_best row: attempt_id, basis, score_ms, generation, ...
    baselines: list[dict[str, Any]] = field(default_factory=list)   # baseline_scores rows
    held_out: list[dict[str, Any]] = field(default_factory=list)    # shape, correct, median_ms
    confirm_failed: list[dict[str, Any]] = field(default_factory=list)  # attempt_id, shape, message

    def apply(self, rows: dict[str, Any]) -> RunProgress:
        """Take the rows of ``warehouse.queries.progress_rows`` (any subset of its keys); returns self."""
        if "counts" in rows:
            counts, predicted = {}, {}
            for r in rows["counts"]:
                if r["generation"] is None:
                    continue
                g, o = int(r["generation"]), str(r["outcome"])
                counts[(g, o)] = int(r["n"])
                if r.get("ms") is not None and o in PASSED:
                    predicted[g] = min(float(r["ms"]), predicted.get(g, float("inf")))
            self.counts, self.predicted = counts, predicted
        if "best" in rows:
            self.best = rows["best"]
        for key in ("baselines", "held_out", "confirm_failed"):
            if key in rows:
                setattr(self, key, list(rows[key]))
        return self

    @property
    def best_ms(self) -> float | None:
        """The best kernel's score (``kernel_scores``: measured or predicted geomean, see ``best_basis``)."""
        return self.best["score_ms"] if self.best else None

    @property
    def best_basis(self) -> str | None:
        """measured | predicted | None (nothing scored yet)."""
        return self.best["basis"] if self.best else None

    @property
    def best_predicted_ms(self) -> float | None:
        """The lowest predicted time (cost model, geomean over the shapes) of a kernel that passed its check."""
        return min(self.predicted.values()) if self.predicted else None

    @property
    def generations(self) -> list[int]:
        return sorted({g for g, _ in self.counts})

    def generation_done(self) -> int:
        """Generations reached, counting from 1 whether the flow numbers them from 0 or 1."""
        gens = self.generations
        if not gens:
            return 0
        return gens[-1] + 1 if gens[0] == 0 else gens[-1]

    def by_outcome(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (_, o), n in self.counts.items():
            out[o] = out.get(o, 0) + n
        return out

    def total(self) -> int:
        return sum(self.counts.values())
