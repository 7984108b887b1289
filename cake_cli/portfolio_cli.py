"""Portfolio commands: ``cake coverage`` (which shapes of a shape set the problem's kernels, or given IR files, can
serve by their domains, before anything is compiled or launched: ``cake_core.pipeline.coverage``), ``cake
regions`` (the regions the portfolio flow searches a shape set in: ``cake_core.pipeline.regions``) and ``cake
portfolio`` (the portfolio flow itself, in the foreground, on this home's server and a local Ray)."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import typer
from rich.table import Table

from cake_cli.display import console
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import PROBLEM_PATH_HELP
from cake_cli.invocation import ir_file
from cake_cli.invocation import problem_paths

SHOWN_UNCOVERED = 12


@cli_errors
def coverage(
    problem: str = typer.Argument(..., help="The problem."),
    shapes: str = typer.Option(..., "--shapes", help="A shape set of the problem, or a CSV file of shapes."),
    kernel: list[Path] | None = typer.Option(None, "--kernel", metavar="FILE.cake",
                                             help="IR files to judge (repeatable); default: the problem's kernels."),
    seed: bool = typer.Option(False, "--seed/--no-seed",
                              help="Count the naive seed with the problem's kernels (it is no reference)."),
    problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR", help=PROBLEM_PATH_HELP),
) -> None:
    """Count the shapes each kernel's domain admits, the shapes no kernel admits and the bounds that refuse them;
    exit 1 when some shape is served by no kernel."""
    from cake_core.ir.text import parse
    from cake_core.pipeline.coverage import coverage as measure
    from cake_core.problems import get_problem
    from cake_core.problems.base import shape_key

    problem_paths(problem_path)
    prob = get_problem(problem)
    sset = prob.shape_set(shapes)
    if kernel:
        texts = {}
        for f in kernel:
            ir_file(f)
            texts[str(f)] = f.read_text()
    else:
        files = [f for f in prob.kernel_files() if seed or f != prob.seed_file]
        texts = {f: prob.kernel_text(f) for f in files}
    programs = {}
    for name, text in texts.items():
        parsed = parse(text, name)
        if not parsed.ok:
            d = next(d for d in parsed.diagnostics if d.is_error)
            raise UsageError(f"{name}:{d.line}: does not parse: {d.message}; `cake check {name}` shows it")
        programs[name] = parsed.program
    if not programs:
        raise UsageError(f"problem `{prob.name}` has no kernels but its seed; pass --seed or --kernel FILE.cake")
    cov = measure(prob, list(sset.shapes), list(sset.roles), programs)
    held = [r == "held_out" for r in sset.roles]
    t = Table(title=f"{prob.name} · {sset.name}: {len(sset.shapes)} shapes ({sum(held)} held out)",
              header_style="bold")
    for col in ("kernel", "admits", "held out admitted", "refused most by"):
        t.add_column(col)
    for name, flags in cov.admitted.items():
        top = ", ".join(f"{b} ({n})" for b, n in cov.refusals[name].most_common(2))
        t.add_row(Path(name).name, f"{sum(flags)}/{len(flags)}",
                  f"{sum(f for f, h in zip(flags, held) if h)}/{sum(held)}", top)
    covered = cov.covered()
    t.add_row("any kernel", f"{sum(covered)}/{len(covered)}",
              f"{sum(c for c, h in zip(covered, held) if h)}/{sum(held)}", "", style="bold")
    console.print(t)
    for key, why in cov.invalid.items():
        typer.echo(f"not a shape of {prob.name}: {key}: {why}")
    missing = cov.uncovered()
    if missing:
        typer.echo(f"{len(missing)} shapes no kernel serves" + (f" (first {SHOWN_UNCOVERED})"
                   if len(missing) > SHOWN_UNCOVERED else "") + ": " +
                   "; ".join(shape_key(s) for s in missing[:SHOWN_UNCOVERED]))
        raise typer.Exit(1)


@cli_errors
def regions(
    problem: str = typer.Argument(..., help="The problem."),
    shapes: str = typer.Option(..., "--shapes", help="A shape set of the problem, or a CSV file of shapes."),
    count: int | None = typer.Option(None, "--regions", min=1, help="Regions (default: ceil(sqrt(rows / 2)))."),
    per_region: int = typer.Option(3, "--per-region", min=1, help="Representatives searched per region."),
    seed: int = typer.Option(0, "--seed", help="Seed of the grouping (the portfolio flow's seed)."),
    problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR", help=PROBLEM_PATH_HELP),
) -> None:
    """Print the regions the portfolio flow (flows/portfolio.py) searches a shape set in: each region's rows,
    its representatives and the held-out rows reported beside it."""
    from cake_core.pipeline.regions import plan_regions
    from cake_core.problems import get_problem
    from cake_core.problems.base import shape_key

    problem_paths(problem_path)
    prob = get_problem(problem)
    sset = prob.shape_set(shapes)
    try:
        planned = plan_regions(sset, prob.dims, count, per_region, seed)
    except ValueError as e:
        raise UsageError(f"--shapes {shapes}: {e}") from None
    t = Table(title=f"{prob.name} · {sset.name}: {len(sset.shapes)} rows in {len(planned)} regions",
              header_style="bold")
    for col in ("region", "rows", "searched on", "held out"):
        t.add_column(col, overflow="fold")
    for r in planned:
        t.add_row(r.name, str(len(r.members)), "; ".join(shape_key(s) for s in r.representatives),
                  str(len(r.held_out)))
    console.print(t)


@cli_errors
def portfolio(
    problem: str = typer.Argument(..., help="The problem."),
    shapes: str = typer.Option(..., "--shapes", help="A shape set of the problem, or a CSV file of shapes."),
    count: int | None = typer.Option(None, "--regions", min=1, help="Regions (default: ceil(sqrt(rows / 2)))."),
    per_region: int = typer.Option(3, "--per-region", min=1, help="Representatives searched per region."),
    generations: int | None = typer.Option(None, "--generations", min=1, help="Generations per region run."),
    population: int | None = typer.Option(None, "--population", min=1, help="Candidates per generation."),
    seed: int = typer.Option(0, "--seed", help="Seed of the grouping and of each region's search."),
    cold: bool = typer.Option(True, "--cold/--warm",
                              help="--cold (default): each region starts from the naive seed alone; --warm: the "
                                   "problem's hand-written kernels are candidates and parents too."),
    problem_path: list[Path] | None = typer.Option(None, "--problem-path", metavar="DIR", help=PROBLEM_PATH_HELP),
) -> None:
    """Evolve PROBLEM over a portfolio, one region of similar shapes at a time (the `portfolio` deployment, run
    here): each region is a run on its representatives whose finalists are then measured on every other row, so
    `cake export` can route each row to its fastest kernel. The same arguments again continue it."""
    import flows.portfolio as flow
    from cake_cli import services
    from cake_cli.evolve_run import _quiet_prefect_console
    from cake_cli.invocation import settings as get_settings
    from cake_core.pipeline.regions import plan_regions
    from cake_core.problems import get_problem
    from tasks.gpus import local_resources
    from tasks.portfolio import other_portfolios

    settings = get_settings()
    problem_paths(problem_path)
    prob = get_problem(problem)
    sset = prob.shape_set(shapes)
    try:                                # a plan that cannot be made fails before any service starts
        plan_regions(sset, prob.dims, count, per_region, seed)
    except ValueError as e:
        raise UsageError(f"--shapes {shapes}: {e}") from None
    set_ref = str(Path(shapes).resolve()) if shapes.endswith(".csv") else shapes
    gpu_models = services.gpu_policy(settings)
    services.preflight(settings)
    pid = flow.portfolio_id_of(prob.name, set_ref, count, per_region, seed)
    typer.echo(f"portfolio {pid}: {prob.name} on {sset.name}, {len(sset.shapes)} rows, "
               f"{'cold' if cold else 'warm'}, {', '.join(gpu_models) if gpu_models else 'CPU only (checked, not timed)'}")
    for other in other_portfolios(str(settings.warehouse_root), prob.name, set_ref, pid):
        typer.echo(f"note: this home also holds portfolio {other} of {prob.name} on {sset.name}; these options "
                   f"name {pid}: to go on with the other, give its options")
    with services.prefect_server(settings), services.ray_runtime(settings, num_gpus=len(gpu_models),
                                                                 resources=local_resources(gpu_models)), \
            _stopped_quietly(pid):
        _quiet_prefect_console()
        out = flow.portfolio_flow(problem=prob.name if prob.source == "built-in" else prob.ref, shape_set=set_ref,
                             regions=count, per_region=per_region, generations=generations, population=population,
                             seed=seed, cold=cold, portfolio_id=pid, warehouse_root=str(settings.warehouse_root),
                             cache_dir=str(settings.cache_dir), gpu_models=gpu_models)
    t = Table(title=f"portfolio {pid} (region runs: {pid}-REGION)", header_style="bold")
    for col in ("region", "rows", "held out", "status", "best", "score ms"):
        t.add_column(col, no_wrap=True)
    for r in out["regions"]:
        t.add_row(r["region"], str(r["rows"]), str(r["held_out"]), r["status"] or "-",
                  (r["best"] or "-")[:12], f"{r['score_ms']:.4g}" if r["score_ms"] else "-")
    console.print(t)
    _write_report(settings.home / "reports" / pid, out["report"])
    typer.echo(f"next: cake export {problem} --shapes {shapes} --out DIR routes each row to its fastest kernel")


@contextlib.contextmanager
def _stopped_quietly(pid: str):
    """Ctrl-C during the portfolio flow stops it as SIGTERM does (``evolve_run.terminate``: Prefect's console quieted
    before the interrupt, else the stopped region's task and the portfolio's flow each log an error with a
    traceback); the stop is said in one line by the CLI's error handling, and what was recorded stays.

    The interrupt alone can be lost: raised while the main thread is inside a DuckDB query it comes back as
    duckdb's InterruptException, which a caller may swallow, and the region's run went on (a Ctrl-C that seemed to
    hang the command). So the handler first asks every run of the process to stop (``run_control``): the region's
    next write, pool poll or stage raises, whatever became of the interrupt, and no later region starts. An
    interrupt that reaches this frame itself (between regions, say) is the same stop, said the same way."""
    import signal

    from cake_cli.evolve_run import terminate
    from tasks.run_control import clear_stop_all, request_stop_all

    def stop(signum: int, frame: object) -> None:
        request_stop_all()
        terminate(signum, frame)

    clear_stop_all()
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before is signal.SIG_IGN:
        yield                                   # `nohup cake portfolio ...` keeps ignoring SIGINT
        return
    signal.signal(signal.SIGINT, stop)
    before_term = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:
        from prefect.exceptions import CancelledRun
        raise CancelledRun(f"portfolio {pid} was stopped") from None
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, before_term)


def _write_report(folder: Path, report: dict) -> None:
    """The portfolio's rows against the peer (the flow's ``tasks.portfolio.portfolio_report``): its summary
    printed, portfolio.md, portfolio.json and speedup.png under ``folder``."""
    import json

    from cake_cli.report_figures import portfolio_speedup
    from tasks.portfolio import portfolio_markdown

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "portfolio.md").write_text(portfolio_markdown(report) + "\n")
    (folder / "portfolio.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    png = portfolio_speedup(report["rows"], folder / "speedup.png")
    for k in ("all", "searched", "held_out"):
        p = report["summary"][k]
        g = f"{p['geomean']:.2f}x" if p["geomean"] else "-"
        typer.echo(f"{k}: {p['covered']}/{p['rows']} rows served, {p['with_peer']} with a peer figure, geomean peer / "
                   f"ours {g}, {len(p['below_1x'])} below 1x")
    typer.echo(f"report: {folder / 'portfolio.md'}" + (f", {png}" if png else " (no row has both figures: no plot)"))
