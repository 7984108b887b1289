"""What the CLI draws: query results as tables or files, and the live view of a run."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

CELL_MAX = 60              # characters shown per cell in `cake sql` tables
TABLE_ROWS_MAX = 200       # rows shown in a terminal table; export for more


def columns_rows(result: Any) -> tuple[list[str], list[tuple]]:
    """Columns and rows of whatever ``Warehouse.query`` returns (Arrow, pandas, DuckDB, rows)."""
    if result is None:
        return [], []
    if hasattr(result, "column_names") and hasattr(result, "to_pylist"):      # pyarrow.Table
        cols = list(result.column_names)
        return cols, [tuple(r[c] for c in cols) for r in result.to_pylist()]
    if hasattr(result, "fetchall") and hasattr(result, "columns"):            # DuckDB relation
        return list(result.columns), [tuple(r) for r in result.fetchall()]
    if hasattr(result, "itertuples") and hasattr(result, "columns"):          # pandas
        return ([str(c) for c in result.columns],
                [tuple(r) for r in result.itertuples(index=False, name=None)])
    rows = list(result)
    if rows and isinstance(rows[0], dict):
        cols = list(rows[0])
        return cols, [tuple(r.get(c) for c in cols) for r in rows]
    rows = [tuple(r) if isinstance(r, (tuple, list)) else (r,) for r in rows]
    return [f"col{i}" for i in range(len(rows[0]) if rows else 0)], rows


def to_arrow(result: Any):
    """The result as a pyarrow.Table (for Parquet export)."""
    import pyarrow as pa

    if isinstance(result, pa.Table):
        return result
    if hasattr(result, "arrow"):             # DuckDB relation
        return result.arrow()
    cols, rows = columns_rows(result)
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


def cell(v: Any) -> str:
    """One value as table text: floats to 6 significant digits, one line, at most CELL_MAX characters."""
    if v is None:
        return ""
    text = f"{v:.6g}" if isinstance(v, float) else str(v)
    text = " ".join(text.split())
    return text if len(text) <= CELL_MAX else text[:CELL_MAX - 1] + "…"


def rich_table(cols: list[str], rows: list[tuple], title: str | None = None) -> Table:
    """A rich Table of the first TABLE_ROWS_MAX rows, cells cut by :func:`cell`."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for c in cols:
        table.add_column(c, overflow="ellipsis")
    for r in rows[:TABLE_ROWS_MAX]:
        table.add_row(*(cell(v) for v in r))
    return table


def print_result(console: Any, result: Any, title: str | None = None,
                 empty: str = "(no rows)") -> None:
    """Print a query result on ``console`` as a table, saying how many rows were left out."""
    cols, rows = columns_rows(result)
    if not rows:
        console.print(Text(empty, style="dim"))
        return
    console.print(rich_table(cols, rows, title))
    if len(rows) > TABLE_ROWS_MAX:
        console.print(Text(f"... {len(rows) - TABLE_ROWS_MAX} more rows; export them all with "
                           f"--format csv --out FILE", style="dim"))


# ---------------------------------------------------------------- cake evolve


# The run's best is the warehouse's `run_best` (kernel_scores: the one definition of a kernel's score);
# the hand-written kernels and peers measured beside it are `baseline_scores`, scored the same way.
BEST_QUERY = "select basis, score_ms from run_best where run_id = ?"
BASELINES_QUERY = ("select name, source, basis, score_ms, correct from baseline_scores where run_id = ? "
                   "order by source, score_ms nulls last, name")


class RunProgress:
    """What the warehouse says about one run: attempts by generation and outcome, best so far, baselines."""

    def __init__(self, root: Path, run_id: str):
        self.root, self.run_id = root, run_id
        self.counts: dict[tuple[int, str], int] = {}
        self._wh: Any = None            # opened once the flow has created the folder
        self.best_ms: float | None = None
        self.best_basis: str | None = None   # measured | predicted
        self.baselines: list[tuple] = []     # (name, source, basis, score_ms, correct)
        self.note: str | None = None    # why the counts may be stale

    def refresh(self) -> RunProgress:
        """Re-read the counts and the best; on any error keep the last ones and say why in ``note``."""
        if not self.root.exists():
            self.note = "waiting for the first attempt"
            return self
        try:
            from warehouse import Warehouse

            wh = self._wh = self._wh or Warehouse(self.root)
            _, rows = columns_rows(wh.query(
                "select generation, outcome, count(*) as n from attempts where run_id = ? "
                "group by all order by all", [self.run_id]))
            self.counts = {(int(g), str(o)): int(n) for g, o, n in rows if g is not None}
            self.note = None
        except Exception as e:  # noqa: BLE001 - the display must outlive a busy or empty warehouse
            self.note = f"warehouse not readable yet ({type(e).__name__})"
            return self
        try:
            _, best = columns_rows(wh.query(BEST_QUERY, [self.run_id]))
            self.best_basis, self.best_ms = (best[0][0], best[0][1]) if best else (None, None)
            _, self.baselines = columns_rows(wh.query(BASELINES_QUERY, [self.run_id]))
        except Exception as e:  # noqa: BLE001 - an older warehouse, or one being compacted: counts still show
            self.note = f"best so far not readable yet ({type(e).__name__})"
        return self

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


def best_text(progress: RunProgress, timed: bool) -> str:
    """The best so far, or why there is none (CPU-only runs are checked, never timed: the model ranks them)."""
    if not timed:
        if progress.best_basis == "predicted" and progress.best_ms is not None:
            return f"checked on CPU, not timed (the cost model predicts {progress.best_ms:.4g} ms, geomean)"
        return "checked on CPU, not timed"
    return (f"{progress.best_ms:.4g} ms (geomean over the shapes of the best kernel's medians)"
            if progress.best_ms is not None and progress.best_basis == "measured" else "none yet")


def baseline_lines(progress: RunProgress) -> list[str]:
    """One line per baseline measured in the run (hand-written kernels, peers), scored as the run's best."""
    out = []
    for name, source, basis, score, correct in progress.baselines:
        who = "hand-written" if source == "hand_written" else "peer"
        if score is None:
            figure = "not timed" + ("" if correct is not False else ", wrong")
        elif basis == "measured":
            figure = f"{score:.4g} ms (geomean, measured in this run)"
        else:
            figure = f"model predicts {score:.4g} ms (geomean; not timed)"
        out.append(f"{who} {name}: {figure}")
    return out


def live_view(progress: RunProgress, problem: str, generations: int, timed: bool,
              started: float) -> Panel:
    """The panel `cake evolve` redraws: generation k/N, attempts by outcome, best so far."""
    lines = Table.grid(padding=(0, 2))
    lines.add_column(style="bold")
    lines.add_column()
    lines.add_row("generation", f"{progress.generation_done()}/{generations}")
    lines.add_row("attempts", str(progress.total()))
    lines.add_row("best so far", best_text(progress, timed))
    lines.add_row("elapsed", f"{time.monotonic() - started:.0f} s")
    parts: list[Any] = [lines]
    outcomes = progress.by_outcome()
    if outcomes:
        t = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        t.add_column("outcome")
        t.add_column("attempts", justify="right")
        for o, n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
            t.add_row(o, str(n))
        parts.append(t)
    if progress.note:
        parts.append(Text(progress.note, style="dim"))
    return Panel(Group(*parts), title=f"cake evolve {problem} · run {progress.run_id}",
                 expand=False)


def summary_table(progress: RunProgress) -> Table:
    """Attempts per generation and outcome, with totals: printed when a run ends or stops."""
    outcomes = sorted(progress.by_outcome())
    t = Table(title=f"run {progress.run_id}", header_style="bold")
    t.add_column("generation", justify="right")
    for o in outcomes:
        t.add_column(o, justify="right")
    t.add_column("total", justify="right")
    for g in progress.generations:
        row = [progress.counts.get((g, o), 0) for o in outcomes]
        t.add_row(str(g), *map(str, row), str(sum(row)))
    totals = progress.by_outcome()
    t.add_row("all", *(str(totals[o]) for o in outcomes), str(progress.total()), style="bold")
    return t
