"""The ``cake`` command line: evolve kernels, ask the warehouse, review the harness, check IR.

Every command reports a problem as one red line on stderr (``error: ...``) and
exits 2 for bad usage or configuration, 1 for a failure (see
:mod:`cake_cli.errors`).

Heavy imports (Prefect, Ray, the flows, the warehouse) happen inside the
commands, after the configuration is validated and after ``PREFECT_API_URL``
is set (see :mod:`cake_cli.services`).
"""
from __future__ import annotations

import csv
import enum
import io
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cake_cli.config import Settings
from cake_cli.portfolio_cli import coverage, portfolio, regions
from cake_cli.display import columns_rows, console, print_result, to_arrow
from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.evolve_options import absolute, request_options
from cake_cli.evolve_run import Stopped, exit_now, run_evolution, terminate
from cake_cli.experiment_cli import experiment_app
from cake_cli.export_cli import export
from cake_cli.harness_cli import harness_app
from cake_cli.invocation import PROBLEM_PATH_HELP, forget_settings
from cake_cli.invocation import ir_file as _ir_file
from cake_cli.invocation import out_file as _out_file
from cake_cli.invocation import problem_paths as _problem_paths
from cake_cli.invocation import settings as _settings
from cake_cli.invocation import warehouse as _warehouse
from cake_cli.lineage_cli import lineage
from cake_cli.model_cli import model_app
from cake_cli.report import report
from cake_cli.service_cli import deploy, server, worker
from cake_cli.services import gpu_policy, preflight

app = typer.Typer(name="cake", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Cake evolves fast GPU kernels written in Cake IR.")
app.add_typer(harness_app, name="harness")


@app.callback()
@cli_errors
def _startup(problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR",
                                                             help=PROBLEM_PATH_HELP)) -> None:
    """Cake evolves fast GPU kernels written in Cake IR."""
    # Validate the configuration before any command runs, so a typo fails first and alone.
    forget_settings()
    _settings()
    _problem_paths(problem_path)
    # A SIGTERM (a scheduler, `timeout`) unwinds like Ctrl-C would: the services this process
    # started (the Prefect server, Ray) are stopped on the way out instead of left running.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


# ---------------------------------------------------------------- cake evolve


def _gpus_asked(settings: Settings) -> tuple[list[str], list[str]]:
    """(this machine's GPUs a local Ray offers, the GPU model(s) the run asks for). ``gpu_model`` asks for a
    model by name; on a joined cluster it needs no local GPU (the cluster's nodes declare theirs)."""
    if settings.gpu != "off" and settings.gpu_model and settings.ray_address:
        return [], [settings.gpu_model]
    local = gpu_policy(settings)
    return local, ([settings.gpu_model] if settings.gpu_model and local else local)


@app.command(no_args_is_help=True)
@cli_errors
@request_options
def evolve(
    asked: dict[str, Any],
    problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR", help=PROBLEM_PATH_HELP),
) -> None:
    """Evolve kernels for PROBLEM with a live display.

    Every attempt lands in the warehouse; the run also shows in the Prefect UI.
    Ctrl-C (or SIGTERM) stops it between stages and records it as cancelled.
    """
    from dataclasses import replace

    from cake_core.pipeline.request import RunRequest, check_values, flow_parameters
    from cake_core.problems.base import is_shape_file

    settings = _settings()
    _problem_paths(problem_path)
    check_values(asked)
    # Check everything that can be wrong with the request before starting any service: the flow's own checks
    # (tasks.opening), then the services' (preflight).
    local_gpus, gpu_models = _gpus_asked(settings)
    request = RunRequest(**absolute(asked, is_shape_file), warehouse_root=str(settings.warehouse_root),
                         cache_dir=str(settings.cache_dir), gpu_models=list(gpu_models), gpu_count=settings.gpu_count,
                         llm={"base_url": settings.llm_base_url, "model": settings.llm_model,
                              "api_key_env": settings.llm_api_key_env})
    from tasks.opening import check_request

    checked = check_request(request, timed=bool(gpu_models))
    if checked.crashed:
        _say(f"marked {len(checked.crashed)} run(s) whose process died as crashed: {', '.join(checked.crashed)}")
    plan, prob = checked.plan, checked.problem
    preflight(settings, plan.agent)
    what = f"resuming run {plan.run_id}" if request.resume else f"run {plan.run_id}"
    start_line = (f"{what}: {plan.problem} on {plan.shape_set}, {plan.generations} generations x "
                  f"{plan.population}, seed {plan.seed}, agent {plan.agent}{', cold' if plan.cold else ''}, "
                  f"{', '.join(gpu_models) if gpu_models else 'CPU only (checked, not timed)'}")
    # a problem from outside the built-ins goes to the flow (and its workers) as its importable reference
    kwargs = flow_parameters(replace(checked.request, problem=prob.name if prob.source == "built-in" else prob.ref))
    try:
        run_evolution(settings, plan.problem, plan.run_id, kwargs, start_line, plan.generations, gpu_models,
                      local_gpus)
    except Stopped:
        if _STANDALONE:
            # The services are down and the count is said. The exit hooks left would only wait:
            # Prefect's, to send a stopped flow's last events to a server that is gone.
            exit_now(130)
        raise typer.Exit(130) from None


_STANDALONE = False   # True in the `cake` process itself (main()); False when a test invokes `app`


for _command in (server, deploy, worker):     # here: `cake --help` lists the commands in registration order
    app.command()(_command)


# ---------------------------------------------------------------- cake sql


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


@app.command(no_args_is_help=True)
@cli_errors
def sql(
    query: str = typer.Argument(..., metavar="QUERY",
                                help="SQL over the warehouse (attempts, measurements, views...)."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Ask the warehouse: print QUERY's result or export it.

    Formats: a table (long cells cut), CSV, JSON, Parquet (needs --out).
    """
    settings = _settings()
    if fmt is Format.parquet and out is None:
        raise UsageError("--format parquet writes a binary file; add --out FILE.parquet")
    _out_file(out)
    result = _warehouse(settings).query(query)

    if fmt is Format.parquet:
        import pyarrow.parquet as pq

        table = to_arrow(result)
        pq.write_table(table, out)
        typer.echo(f"wrote {table.num_rows} rows to {out}", err=True)
        return
    cols, rows = columns_rows(result)
    if fmt is Format.table and out is None:
        print_result(console, result)
        return
    buf = io.StringIO()
    if fmt is Format.table:  # a table into a file: wide, untruncated, plain text
        wide = Table(header_style=None)
        for c in cols:
            wide.add_column(c)
        for r in rows:
            wide.add_row(*("" if v is None else str(v) for v in r))
        Console(file=buf, width=100_000, color_system=None).print(wide)
    elif fmt is Format.csv:
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(["" if v is None else v for v in r] for r in rows)
    else:
        json.dump([dict(zip(cols, r)) for r in rows], buf, default=str, indent=1)
        buf.write("\n")
    if out is None:
        sys.stdout.write(buf.getvalue())
        return
    out.write_text(buf.getvalue())
    typer.echo(f"wrote {len(rows)} rows to {out}", err=True)


# ---------------------------------------------------------------- cake problems


@app.command()
@cli_errors
def problems(problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR",
                                                           help=PROBLEM_PATH_HELP)) -> None:
    """List the problems Cake can find (built-in, installed packages' entry points, problem paths), where each
    came from, its shape sets, and every problem that could not be loaded, one line each."""
    from cake_core.problems import catalogue

    _problem_paths(problem_path)
    cat = catalogue()
    t = Table(header_style="bold")
    t.add_column("problem")
    t.add_column("description")
    t.add_column("shape sets")
    t.add_column("from")
    for p in cat.problems.values():
        what = p.description.split(";")[0]
        what = what if len(what) <= 72 else what[:71] + "…"
        t.add_row(p.name, Text(what), ", ".join(p.shape_sets), p.source if p.source == "built-in" else
                  f"{p.source} ({p.root})" if p.source.startswith("entry point") else p.source)
    console.print(t)
    for b in cat.broken:
        typer.secho(f"broken problem: {b.line()}", err=True, fg=typer.colors.RED)


# ---------------------------------------------------------------- cake check


@app.command(no_args_is_help=True)
@cli_errors
def check(
    file: Path = typer.Argument(..., metavar="FILE.cake", help="Cake IR file to check."),
    target: str = typer.Option("sm_90a", "--target", help="Target architecture."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnostics as JSON."),
) -> None:
    """Check a Cake IR file; exit 1 if it has errors.

    Runs the parser, the type checks and the verifier rules for --target.
    """
    _ir_file(file)
    n_err = _print_diagnostics(file, target, as_json)
    if n_err:
        raise typer.Exit(1)


def _print_diagnostics(file: Path, target: str, as_json: bool = False, quiet_ok: bool = False) -> int:
    """Check ``file`` and print its diagnostics as a compiler does (or as JSON); returns the error count."""
    from cake_core.ir.check import check_file

    diagnostics = list(check_file(str(file), target=target))
    n_err = sum(1 for d in diagnostics if d.is_error)
    if as_json:
        sys.stdout.write(json.dumps({"file": str(file), "target": target, "errors": n_err,
                                     "diagnostics": [d.to_dict() for d in diagnostics]},
                                    indent=1) + "\n")
        return n_err
    source = file.read_text()
    for d in diagnostics:
        typer.echo(d.format(str(file), source))
    n_other = len(diagnostics) - n_err
    if diagnostics:
        typer.echo(f"{file}: {n_err} error(s), {n_other} other diagnostic(s)")
    elif not quiet_ok:
        typer.echo(f"{file}: ok")
    return n_err


# ---------------------------------------------------------------- cake run / cake ops


@app.command(no_args_is_help=True)
@cli_errors
def run(
    file: Path = typer.Argument(..., metavar="FILE.cake", help="Cake IR file to run."),
    problem: str = typer.Option(..., "--problem", help="Problem whose oracle judges the output."),
    shape: list[str] = typer.Option(..., "--shape", help="A shape such as M=96,N=80,K=72 (repeatable)."),
    cpu: bool = typer.Option(True, "--cpu/--no-cpu", help="Run on the CPU interpreter (the only backend here)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR", help=PROBLEM_PATH_HELP),
) -> None:
    """Run an IR file on the CPU against an oracle.

    The CPU interpreter runs FILE on each --shape against the problem's oracle;
    exit 1 if any shape is wrong. A file that does not verify is not run: its
    diagnostics print as `cake check` prints them.
    """
    if not cpu:
        raise UsageError("only --cpu is available from `cake run`; GPU runs go through `cake evolve`")
    _ir_file(file)
    _problem_paths(problem_path)
    from cake_core.problems import get_problem
    from cake_core.problems.base import parse_shape_key
    from cake_core.runtime.cpu import run_file

    prob = get_problem(problem)
    shapes = [parse_shape_key(s, prob.dims) for s in shape]
    # A file that does not verify is answered as `cake check` answers it, one diagnostic per block.
    if _print_diagnostics(file, "sm_90a", quiet_ok=True):
        typer.echo(f"{file}: not run: fix the errors above (`cake check {file}` shows them again)")
        raise typer.Exit(1)
    checks = run_file(file, problem, shapes, seed=seed)
    t = Table(title=f"{file} on {problem} (CPU interpreter)")
    for col in ("shape", "correct", "max rel error"):
        t.add_column(col, no_wrap=True)
    t.add_column("message", overflow="fold")
    for c in checks:
        t.add_row(c.shape, "yes" if c.correct else "NO", "" if c.max_error is None else f"{c.max_error:.3g}",
                  c.message)
    console.print(t)
    if not all(c.correct for c in checks):
        raise typer.Exit(1)


@app.command()
@cli_errors
def ops() -> None:
    """Print the Cake IR reference.

    Every op, its types, preconditions, example and the rules that guard it.
    """
    from cake_core.ir.reference import render_reference

    sys.stdout.write(render_reference())


# last, in this order: `cake --help` lists the commands in registration order
app.add_typer(model_app, name="model")
app.add_typer(experiment_app, name="experiment")
app.command("report", no_args_is_help=True)(report)
app.command(no_args_is_help=True)(coverage)
app.command(no_args_is_help=True)(regions)
app.command(no_args_is_help=True)(portfolio)
app.command(no_args_is_help=True)(lineage)
app.command(no_args_is_help=True)(export)


def main() -> None:
    """The `cake` command (the console script): :data:`app` in a process of its own."""
    global _STANDALONE
    _STANDALONE = True
    app()


if __name__ == "__main__":
    main()
