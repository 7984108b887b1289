"""``cake export PROBLEM --out DIR``: the fastest kernel per shape as a package users import without Cake.

    cake export PROBLEM --out dist                     # every measured shape, on the one GPU model measured
    cake export PROBLEM --out dist --gpu-model H200 --run RUN_ID --shapes SET --name my_kernels
    cake export PROBLEM --out dist --unmeasured        # also shapes no run measured, by the nearest measured one
    cake export PROBLEM --out dist --cede-to-peer      # leave shapes where the peer measured faster to fallback=

Reads the warehouse (read-only), picks per shape the fastest kernel measured correct (cold L2, CUDA events; a
confirmation beats a search measurement; a held-out shape's measurements only with ``--include-held-out``),
compiles each for the arch and writes ``DIR/NAME`` (``cake_core.export``). A problem with no correct
measurement, a GPU model or run the warehouse lacks, a selection that keeps nothing, a missing nvcc: one line
each.
"""
from __future__ import annotations

from pathlib import Path

import typer

from cake_cli.display import console, say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import settings, warehouse


def _shape_keys(problem, spec: str | None) -> tuple[str, ...] | None:
    """The shape keys of ``--shapes``: a shape set of the problem, or a CSV file of one."""
    if spec is None:
        return None
    from cake_core.problems.base import shape_key

    return tuple(shape_key(s) for s in problem.shape_set(spec).shapes)


@cli_errors
def export(problem: str = typer.Argument(..., help="the problem whose kernels to export"),
           out: Path = typer.Option(..., "--out", help="the folder the package is written into"),
           run: list[str] | None = typer.Option(None, "--run", metavar="RUN_ID",
                                               help="only these runs' measurements (repeatable; default: all)"),
           gpu_model: str | None = typer.Option(None, "--gpu-model", help="the GPU model to export for "
                                                "(default: the one the problem was measured on)"),
           shapes: str | None = typer.Option(None, "--shapes", metavar="SET_OR_CSV",
                                             help="only the shapes of this shape set (or CSV file)"),
           arch: str | None = typer.Option(None, "--arch", help="compile for this arch (default: the GPU's, sm_90a)"),
           name: str | None = typer.Option(None, "--name", help="the package's name (default: cake_PROBLEM)"),
           unmeasured: bool = typer.Option(False, "--unmeasured", help="also route shapes with no measurement "
                                           "of their own (never measured, or held out) to the kernel that won the "
                                           "nearest measured shape (sum over the dims of |log2 a - log2 b|) among "
                                           "those whose domain holds them"),
           include_held_out: bool = typer.Option(False, "--include-held-out", help="also route held-out rows by "
                                                 "their own measurements; their figures then no longer measure "
                                                 "generalisation"),
           cede_to_peer: bool = typer.Option(False, "--cede-to-peer", help="leave the shapes where the peer "
                                             "measured faster than every kernel uncovered (run() then calls its "
                                             "fallback=, e.g. the peer, there), and unmeasured shapes nearest to "
                                             "one of them")) -> None:
    """Export PROBLEM's fastest kernel per shape as a package: a per-shape dispatcher over cubins."""
    from rich.table import Table

    from cake_core.export.build import ExportRequest, SelectionError, export_problem
    from cake_core.problems import get_problem
    from warehouse.queries import export_rows

    s = settings()
    prob = get_problem(problem)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name a folder")
    req = ExportRequest(out=out, name=name or f"cake_{prob.name}", gpu_model=gpu_model, arch=arch,
                        shapes=_shape_keys(prob, shapes), run_ids=tuple(run or ()), domain_routes=unmeasured,
                        include_held_out=include_held_out, cede_to_peer=cede_to_peer, cache_dir=s.cache_dir)
    rows = export_rows(warehouse(s), prob.name, list(run) if run else None)
    try:
        result = export_problem(prob, rows, req)
    except SelectionError as e:
        raise UsageError(str(e)) from None
    m = result.manifest
    kernels = {k["id"]: k for k in m["kernels"]}
    t = Table(title=f"{result.path}: {prob.name} on {m['gpu_model']} ({m['arch']})", header_style="bold",
              title_justify="left")
    for col in ("route", "kernel", "shapes", "ms (min..max)", "peer ms"):
        t.add_column(col, no_wrap=col != "kernel")
    for r in m["routes"]:
        wins = list(r["shapes"].values())
        ms = [w["median_ms"] for w in wins]
        peers = [w["peer"]["median_ms"] for w in wins if w["peer"]]
        t.add_row(r["kind"], r["kernel"], str(len(wins)) if wins else "nearest in its domain",
                  f"{min(ms):.4g}..{max(ms):.4g}" if ms else "-", f"{min(peers):.4g}..{max(peers):.4g}" if peers else "-")
    console.print(t)
    held = sum(1 for r in m["routes"] for w in r["shapes"].values() if w["held_out"])
    nearest = ""
    if result.held_out_left:
        nearest = f"; held-out rows left to the nearest-shape routing: {len(result.held_out_left)}"
        nearest += "" if unmeasured else " (not covered without --unmeasured)"
    if result.ceded:
        say(f"{len(result.ceded)} measured shapes left to the peer, faster there: {', '.join(sorted(result.ceded)[:4])}"
            f"{' ...' if len(result.ceded) > 4 else ''}")
    for h, why in result.skipped.items():
        say(f"set aside {h} (its shapes go to the next fastest kernel): {why}")
    say(f"{len(m['exact'])} measured shapes routed ({held} held out), {len(kernels)} kernels, GPU model "
        f"{m['gpu_model']}{nearest}; import it with sys.path holding {result.path.parent}: "
        f"`import {result.path.name}`")
