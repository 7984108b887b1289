"""``cake lineage ATTEMPT_ID``: how a kernel came to be, step by step from its run's seed.

    cake lineage 3f2a...              # generation, tactic, outcome, score and speed-up of every step
    cake lineage 3f2a... --ir         # ... and the kernel's Cake IR
    cake lineage 3f2a... --format json

An unknown attempt, or a home without a warehouse, is one line that says what to do.
"""
from __future__ import annotations

import json

import typer

from cake_cli.display import console, say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import settings, warehouse


@cli_errors
def lineage(attempt_id: str = typer.Argument(..., help="an attempt id (cake sql \"select attempt_id from attempts\")"),
            ir: bool = typer.Option(False, "--ir", help="also print the kernel's Cake IR"),
            fmt: str = typer.Option("table", "--format", help="table | json")) -> None:
    """The steps from the run's seed to ATTEMPT_ID: each step's tactics, outcome, score and speed-up."""
    from rich.table import Table

    from warehouse.lineage import lineage as walk

    if fmt not in ("table", "json"):
        raise UsageError(f"--format {fmt!r}: use table or json")
    wh = warehouse(settings())
    steps = walk(wh, attempt_id)
    text = wh.query("select ir_text from attempts where attempt_id = ?", [attempt_id]).to_pylist()[0]["ir_text"]
    if fmt == "json":
        say(json.dumps({"steps": [s.as_dict() for s in steps], **({"ir_text": text} if ir else {})}, indent=1))
        return
    table = Table(title=f"lineage of {attempt_id} ({len(steps)} steps)", header_style="bold", box=None,
                  pad_edge=False, title_justify="left")
    table.add_column("gen", justify="right", no_wrap=True)
    table.add_column("attempt", no_wrap=True, min_width=len(attempt_id))     # what a user types next: never cut
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("×parent", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("tactic", overflow="fold")                               # last: it may wrap
    for s in steps:
        table.add_row(str(s.generation), s.attempt_id,
                      (f"{s.score_ms:.3g}" + ("" if s.basis == "measured" else "*")) if s.score_ms else "-",
                      f"{s.speedup:.2f}" if s.speedup else "-", s.outcome, s.tactic or "-")
    table.caption = "ms: measured over the run's headline shapes; * predicted by the cost model"
    table.caption_justify = "left"
    console.print(table)
    if ir:
        say(text)
