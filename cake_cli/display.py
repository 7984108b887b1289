"""What the CLI draws: query results as tables or files, and the live view of a run."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cake_core.pipeline.progress import RunProgress

console = Console(highlight=False)   # stdout; file=None follows sys.stdout (tests swap it)


def say(text: str) -> None:
    """A plain line on stdout: no markup, never wrapped (paths and commands must stay copyable)."""
    console.print(text, markup=False, soft_wrap=True)


CELL_MAX = 60              # characters shown per cell in `cake sql` tables
RECORD_CELL_MAX = 400      # characters shown per value when rows print as records
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


def _typed(column: str) -> bool:
    """Columns whose values a person types back (ids, hashes): never cut."""
    c = column.lower()
    return c == "id" or c.endswith(("_id", "_hash"))


def cell(v: Any, limit: int = CELL_MAX) -> str:
    """One value as text: floats to 6 significant digits, one line, at most ``limit`` characters (0: all)."""
    if v is None:
        return ""
    text = f"{v:.6g}" if isinstance(v, float) else str(v)
    text = " ".join(text.split())
    return text if not limit or len(text) <= limit else text[:limit - 1] + "…"


def rich_table(cols: list[str], rows: list[tuple], title: str | None = None) -> Table:
    """A rich Table of the first TABLE_ROWS_MAX rows; long cells cut by :func:`cell`, ids never."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for c in cols:
        table.add_column(c, no_wrap=True)
    for r in rows[:TABLE_ROWS_MAX]:
        table.add_row(*(cell(v, 0 if _typed(c) else CELL_MAX) for c, v in zip(cols, r)))
    return table


def records(cols: list[str], rows: list[tuple], width: int, title: str | None = None) -> Text:
    """Rows as blocks of ``column  value`` lines: what a table too wide for ``width`` becomes.

    Values wrap under their own start (a long id folds onto the next line, never cut).
    """
    pad = max(len(c) for c in cols) + 2
    room = max(20, width - pad)
    out = Text()
    if title:
        out.append(f"{title}\n", style="bold")
    for i, r in enumerate(rows[:TABLE_ROWS_MAX], start=1):
        out.append(f"-[ row {i} ]\n", style="dim")
        for c, v in zip(cols, r):
            lines = textwrap.wrap(cell(v, 0 if _typed(c) else RECORD_CELL_MAX), room, break_on_hyphens=False)
            out.append(c.ljust(pad), style="bold")
            out.append(("\n" + " " * pad).join(lines or [""]) + "\n")
    return out


def print_result(console: Any, result: Any, title: str | None = None,
                 empty: str = "(no rows)") -> None:
    """Print a query result on ``console``: a table if it fits the width, else one record per row.

    Nothing a person types back (an id) is ever cut; the width is the
    terminal's, or 80 columns when the output is piped.
    """
    cols, rows = columns_rows(result)
    if not rows:
        console.print(Text(empty, style="dim"))
        return
    table = rich_table(cols, rows, title)
    unbounded = console.options.update(width=1_000_000, max_width=1_000_000)
    if Measurement.get(console, unbounded, table).maximum <= console.width:
        console.print(table)
    else:
        console.print(records(cols, rows, console.width, title), soft_wrap=True)
    if len(rows) > TABLE_ROWS_MAX:
        console.print(Text(f"... {len(rows) - TABLE_ROWS_MAX} more rows; export them all with "
                           f"--format csv --out FILE", style="dim"))


# ---------------------------------------------------------------- cake evolve


class LiveProgress(RunProgress):
    """A run's progress (``cake_core.pipeline.progress.RunProgress``, the flow's summary reads the same) that
    re-reads itself from the warehouse (``warehouse.queries``) for the live view."""

    def __init__(self, root: Path, run_id: str):
        super().__init__(run_id)
        self.root = root
        self._wh: Any = None            # opened once the flow has created the folder
        self.note: str | None = None    # why the figures may be stale

    def refresh(self) -> LiveProgress:
        """Re-read the counts and the best; on any error keep the last ones and say why in ``note``."""
        if not self.root.exists():
            self.note = "waiting for the first attempt"
            return self
        try:
            from warehouse import Warehouse
            from warehouse.queries import attempt_counts

            wh = self._wh = self._wh or Warehouse(self.root)
            self.apply({"counts": attempt_counts(wh, self.run_id)})
            self.note = None
        except Exception as e:  # noqa: BLE001 - the display must outlive a busy or empty warehouse
            self.note = f"warehouse not readable yet ({type(e).__name__})"
            return self
        try:
            from warehouse.queries import baseline_scores, run_best

            self.apply({"best": run_best(wh, self.run_id), "baselines": baseline_scores(wh, self.run_id)})
        except Exception as e:  # noqa: BLE001 - an older warehouse, or one being compacted: counts still show
            self.note = f"best so far not readable yet ({type(e).__name__})"
        return self


def _ms(x: float) -> str:
    return f"{x:.4g} ms"


def best_text(progress: RunProgress, timed: bool) -> str:
    """The best so far (the warehouse's ``run_best``), or why there is none; a CPU run is checked, never
    timed: its best is the cost model's prediction, with where it started."""
    if not timed:
        if progress.best_basis != "predicted" or progress.best_ms is None:
            return "nothing timed (CPU run: checked on the interpreter); no kernel passed its check yet"
        first = progress.predicted.get(min(progress.predicted)) if progress.predicted else None
        since = (f", from {_ms(first)} in generation {min(progress.predicted)}"
                 if first and first > progress.best_ms else "")
        return (f"predicted {_ms(progress.best_ms)}{since} (cost model, geomean over the shapes); nothing "
                f"timed: a CPU run is checked on the interpreter")
    return (f"{_ms(progress.best_ms)} (geomean over the shapes of the best kernel's medians)"
            if progress.best_ms is not None and progress.best_basis == "measured" else "none yet")


def baseline_lines(progress: RunProgress) -> list[str]:
    """One line per baseline measured in the run (hand-written kernels, peers), scored as the run's best."""
    out = []
    for b in progress.baselines:
        name, basis, score, correct = b["name"], b["basis"], b["score_ms"], b["correct"]
        who = "hand-written" if b["source"] == "hand_written" else "peer"
        if score is None:
            figure = "not timed" + ("" if correct is not False else ", wrong")
        elif basis == "measured":
            figure = f"{score:.4g} ms (geomean, measured in this run)"
        else:
            figure = f"model predicts {score:.4g} ms (geomean; not timed)"
        out.append(f"{who} {name}: {figure}")
    return out


def live_view(progress: LiveProgress, problem: str, generations: int, timed: bool,
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


def summary_table(progress: RunProgress, timed: bool = True) -> Table:
    """Per generation: attempts, their outcomes, and the best predicted time (a CPU run's only figure).

    One row per generation with the outcomes as text keeps the table inside 80
    columns however many outcomes there are.
    """
    t = Table(title=f"run {progress.run_id}", header_style="bold")
    t.add_column("gen", justify="right", no_wrap=True)
    t.add_column("attempts", justify="right", no_wrap=True)
    t.add_column("outcomes", overflow="fold")
    t.add_column("best predicted" if not timed else "best predicted (model)", justify="right", no_wrap=True)
    for g in progress.generations:
        row = {o: n for (gg, o), n in progress.counts.items() if gg == g}
        t.add_row(str(g), str(sum(row.values())), _outcomes_text(row),
                  _ms(progress.predicted[g]) if g in progress.predicted else "")
    best = progress.best_predicted_ms
    t.add_row("all", str(progress.total()), _outcomes_text(progress.by_outcome()),
              _ms(best) if best is not None else "", style="bold")
    return t


def _outcomes_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{o}={n}" for o, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
