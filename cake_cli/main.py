"""The ``cake`` command line: evolve kernels, ask the warehouse, review the harness, check IR.

Every command reports a problem as one red line on stderr (``error: ...``) and
exits 2 for bad usage or configuration, 1 for a failure. An unexpected
exception is one line too; its traceback goes to ``<home>/logs/cli.log``.

Heavy imports (Prefect, Ray, the flows, the warehouse) happen inside the
commands, after the configuration is validated and after ``PREFECT_API_URL``
is set (see :mod:`cake_cli.services`).
"""
from __future__ import annotations

import csv
import datetime as dt
import enum
import functools
import getpass
import io
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cake_cli.config import ConfigError, Settings, load_settings
from cake_cli.display import (RunProgress, baseline_lines, best_text, columns_rows, live_view, print_result,
                              summary_table, to_arrow)
from cake_cli.services import gpu_policy, prefect_server, ray_runtime
from tasks.gpus import local_resources
from cake_core.errors import CakeError

app = typer.Typer(name="cake", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Cake evolves fast GPU kernels written in Cake IR.")
harness_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                          rich_markup_mode=None,
                          help="Review harness proposals and list harness versions.")
app.add_typer(harness_app, name="harness")

console = Console(highlight=False)   # stdout; file=None follows sys.stdout (tests swap it)

REFRESH_S = 0.5            # live display refresh period
PROPOSALS_VIEW = "proposals_latest"
VERSIONS_QUERY = "select * from harness_versions order by version"

_settings_cache: list[Settings] = []   # the settings of this invocation, once loaded


class UsageError(CakeError):
    """The command line asked for something that cannot be done as asked (exit code 2)."""


# ---------------------------------------------------------------- errors and settings


def _settings() -> Settings:
    """Load and validate the configuration once per invocation."""
    if not _settings_cache:
        _settings_cache.append(load_settings())
    return _settings_cache[0]


def _usage_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConfigError, UsageError]
    try:
        from cake_core.problems import ShapeSetError, UnknownProblem
        types += [UnknownProblem, ShapeSetError]
    except ImportError:
        pass
    return tuple(types)


def _reported_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [CakeError]
    try:
        from warehouse import WarehouseError
        types.append(WarehouseError)
    except ImportError:
        pass
    return tuple(types)


def _home_for_log() -> Path:
    if _settings_cache:
        return _settings_cache[0].home
    return Path(os.environ.get("CAKE_HOME") or ".cake").expanduser().absolute()


def _say_error(message: str) -> None:
    # typer.secho, not rich: rich would wrap a long message over several lines.
    first = " ".join(str(message).split()) or "(no message)"
    typer.secho(f"error: {first}", fg="red", err=True)


def _log_internal(exc: BaseException) -> Path | None:
    """Append the traceback to <home>/logs/cli.log; return the path, or None if it cannot be written."""
    log = _home_for_log() / "logs" / "cli.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"--- {dt.datetime.now().isoformat(timespec='seconds')} "
                    f"cake {' '.join(sys.argv[1:])}\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return log


F = TypeVar("F", bound=Callable[..., Any])


def cli_errors(fn: F) -> F:
    """Turn every exception out of a command into one line on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # typer's own exits (typer >= 0.16 has its own classes) and usage errors
        except KeyboardInterrupt:
            _say_error("interrupted")
            raise typer.Exit(130) from None
        except _reported_error_types() as e:
            _say_error(str(e))
            raise typer.Exit(2 if isinstance(e, _usage_error_types()) else 1) from None
        except Exception as e:  # noqa: BLE001 - the last line of defence: one line, log the rest
            log = _log_internal(e)
            where = f"full traceback in {log}" if log else "traceback could not be written"
            msg = " ".join(str(e).split())
            _say_error(f"internal: {type(e).__name__}: {msg} ({where})")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
@cli_errors
def _startup() -> None:
    """Cake evolves fast GPU kernels written in Cake IR."""
    # Validate the configuration before any command runs, so a typo fails first and alone.
    _settings_cache.clear()
    _settings()
    # A SIGTERM (a scheduler, `timeout`) unwinds like Ctrl-C would: the services this process
    # started (the Prefect server, Ray) are stopped on the way out instead of left running.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same orderly stop as Ctrl-C


def _say(text: str) -> None:
    """A plain line on stdout: no markup, never wrapped (paths and commands must stay copyable)."""
    console.print(text, markup=False, soft_wrap=True)


def _ir_file(file: Path) -> None:
    """A UsageError unless ``file`` is a readable file (a directory is not one)."""
    if file.is_dir():
        raise UsageError(f"{file} is a directory; pass a .cake file")
    if not file.is_file():
        raise UsageError(f"{file}: no such file")


def _out_file(out: Path | None) -> None:
    """A UsageError if ``--out`` cannot be written: a directory, or in a folder that does not exist."""
    if out is None:
        return
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; name a file")
    if not out.absolute().parent.is_dir():
        raise UsageError(f"--out {out}: folder {out.absolute().parent} does not exist")


def _warehouse(settings: Settings):
    """The warehouse under settings.home; a UsageError if no run has created it yet."""
    from warehouse import Warehouse

    root = settings.warehouse_root
    if not root.exists():
        raise UsageError(f"no warehouse at {root} yet; run `cake evolve PROBLEM` first, "
                         f"or set CAKE_HOME to the directory that holds warehouse/")
    return Warehouse(root)


# ---------------------------------------------------------------- cake evolve


def _quiet_prefect_console() -> None:
    """Keep Prefect's INFO lines off the terminal (they stay in the UI): the live display owns it."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    for name in ["", "prefect", *logging.root.manager.loggerDict]:
        logger = logging.getLogger(name)
        for h in getattr(logger, "handlers", []):
            if type(h).__name__ == "PrefectConsoleHandler" and h.level < logging.WARNING:
                h.setLevel(logging.WARNING)


def _cancel_flow_run(tag: str) -> None:
    """Mark the run's Prefect flow run cancelled so the UI tells the truth (best effort)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
        from prefect.states import Cancelled

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag])))
            for run in runs:
                if run.state is None or not run.state.is_final():
                    client.set_flow_run_state(run.id, Cancelled(
                        message="stopped with Ctrl-C in `cake evolve`"), force=True)
    except Exception:  # noqa: BLE001 - stopping must not fail because the UI could not be told
        pass


def _sql_hint(run_id: str) -> str:
    return (f'cake sql "select generation, outcome, count(*) from attempts '
            f"where run_id = '{run_id}' group by all order by all\"")


def _print_where(settings: Settings, ui_url: str, run_id: str) -> None:
    _say(f"warehouse: {settings.warehouse_root}")
    _say(f"Prefect UI: {ui_url}  (flow runs tagged cake-run:{run_id})")


def _gpus_asked(settings: Settings) -> tuple[list[str], list[str]]:
    """(this machine's GPUs a local Ray offers, the GPU model(s) the run asks for). ``gpu_model`` asks for a
    model by name; on a joined cluster it needs no local GPU (the cluster's nodes declare theirs)."""
    if settings.gpu != "off" and settings.gpu_model and settings.ray_address:
        return [], [settings.gpu_model]
    local = gpu_policy(settings)
    return local, ([settings.gpu_model] if settings.gpu_model and local else local)


@app.command(no_args_is_help=True)
@cli_errors
def evolve(
    problem: str = typer.Argument(..., metavar="PROBLEM", help="Problem to evolve a kernel for (see `cake problems`)."),
    shapes: str | None = typer.Option(None, "--shapes", metavar="SET",
                                      help="Shape set to tune on (default: the problem's first). Its held-out "
                                           "rows are measured for the final best only, never selected on."),
    generations: int | None = typer.Option(None, "--generations", min=1,
                                           help="Generations to run in all (default 3; a resumed run may raise it)."),
    population: int | None = typer.Option(None, "--population", min=1, help="Candidates per generation (default 8)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed (default 0): the tactic agent is deterministic under it."),
    agent: str | None = typer.Option(None, "--agent", help="tactic (offline, the default) or llm."),
    cold: bool = typer.Option(False, "--cold", help="Start from the problem's naive seed alone: its hand-written "
                                                    "kernels are never offered, only measured beside the result."),
    resume: str | None = typer.Option(None, "--resume", metavar="RUN_ID",
                                      help="Continue run RUN_ID from the warehouse (after a kill, or a job split "
                                           "in several)."),
    harness: int | None = typer.Option(None, "--harness", min=0, metavar="N",
                                       help="Harness version to run under (default: the newest approved)."),
    budget_candidates: int | None = typer.Option(None, "--budget-candidates", min=1,
                                                 help="Stop after this many attempts in all."),
    budget_gpu_minutes: float | None = typer.Option(None, "--budget-gpu-minutes", min=0.001,
                                                    help="Stop once the attempts held the GPUs this long."),
    patience: int | None = typer.Option(None, "--patience", min=1,
                                        help="Stop when the best has not improved for this many generations."),
    check_shapes: str | None = typer.Option(None, "--check-shapes", metavar="SET",
                                            help="Without a GPU: check on SET's rows (small enough for the "
                                                 "interpreter) and rank by the cost model on --shapes."),
    debug: bool = typer.Option(False, "--debug", help="Re-verify after every stage and dump numbered IR under "
                                                      "<home>/debug."),
) -> None:
    """Evolve kernels for PROBLEM with a live display.

    Every attempt lands in the warehouse; the run also shows in the Prefect UI.
    """
    settings = _settings()
    if agent is not None and agent not in ("tactic", "llm"):
        raise UsageError(f"--agent {agent!r} is not known; use tactic or llm")
    if agent == "llm":
        if not settings.llm_model:
            raise ConfigError("the llm agent needs a model: set CAKE_LLM_MODEL (or llm_model in "
                              "cake.toml)")
        if not os.environ.get(settings.llm_api_key_env):
            raise ConfigError(f"the llm agent needs an API key in ${settings.llm_api_key_env} "
                              f"(named by setting llm_api_key_env)")

    # Check everything that can be wrong with the request before starting any service.
    from cake_core.pipeline.plan import DEFAULT_GENERATIONS, DEFAULT_POPULATION
    from cake_core.problems import get_problem, load_shape_set

    prob = get_problem(problem)
    local_gpus, gpu_models = _gpus_asked(settings)
    timed = bool(gpu_models)
    asked: dict[str, Any] = dict(generations=generations, population=population, seed=seed, agent=agent,
                                 cold=True if cold else None, harness_version=harness,
                                 budget_candidates=budget_candidates, budget_gpu_minutes=budget_gpu_minutes,
                                 patience=patience, check_shape_set=check_shapes)
    if resume:
        from tasks.history import plan_resume

        plan = plan_resume(str(_warehouse(settings).root), resume, {"problem": problem, "shape_set": shapes, **asked},
                           timed)
        run_id, shape_set = resume, plan.shape_set
        shown = dict(generations=plan.generations, population=plan.population, seed=plan.seed, agent=plan.agent,
                     cold=plan.cold)
    else:
        shape_set = shapes
        if shape_set is None:
            declared = list(getattr(prob, "shape_sets", []) or [])
            if not declared:
                raise UsageError(f"problem {problem} declares no shape set; pass --shapes SET")
            shape_set = declared[0]
        load_shape_set(prob, shape_set)
        if check_shapes is not None:
            load_shape_set(prob, check_shapes)
        if harness:
            _harness_exists(settings, harness)
        run_id = f"{problem}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        shown = dict(generations=generations or DEFAULT_GENERATIONS, population=population or DEFAULT_POPULATION,
                     seed=seed or 0, agent=agent or "tactic", cold=cold)
    total = shown["generations"]
    tag = f"cake-run:{run_id}"
    for d in (settings.warehouse_root.parent, settings.cache_dir, settings.logs_dir):
        d.mkdir(parents=True, exist_ok=True)

    with prefect_server(settings) as pf, ray_runtime(settings, num_gpus=len(local_gpus),
                                                     resources=local_resources(local_gpus)):
        _quiet_prefect_console()
        from flows.evolve import evolve_flow
        import prefect

        _print_where(settings, pf.ui_url, run_id)
        what = f"resuming run {run_id}" if resume else f"run {run_id}"
        _say(f"{what}: {problem} on {shape_set}, {total} generations x {shown['population']}, seed "
             f"{shown['seed']}, agent {shown['agent']}{', cold' if shown['cold'] else ''}, "
             f"{', '.join(gpu_models) if gpu_models else 'CPU only (checked, not timed)'}")
        kwargs: dict[str, Any] = dict(
            problem=problem, shape_set=shape_set if not resume else shapes, generations=generations,
            population=population, seed=seed, run_id=run_id, warehouse_root=str(settings.warehouse_root),
            cache_dir=str(settings.cache_dir), gpu_models=list(gpu_models), gpu_count=settings.gpu_count)
        kwargs["agent"] = agent
        for k in ("cold", "harness_version", "budget_candidates", "budget_gpu_minutes", "patience",
                  "check_shape_set"):
            if asked[k] is not None:
                kwargs[k] = asked[k]
        if resume:
            kwargs["resume"] = resume
        if debug:
            kwargs["debug"] = True
        if shown["agent"] == "llm":
            kwargs["llm"] = {"base_url": settings.llm_base_url, "model": settings.llm_model,
                             "api_key_env": settings.llm_api_key_env}

        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                with prefect.tags(tag):
                    outcome["value"] = evolve_flow(**kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                outcome["error"] = e

        worker = threading.Thread(target=work, name="cake-evolve", daemon=True)
        progress = RunProgress(settings.warehouse_root, run_id)
        started = time.monotonic()
        try:
            with Live(live_view(progress, problem, total, timed, started),
                      console=console, refresh_per_second=4, transient=True) as live:
                worker.start()
                while worker.is_alive():
                    worker.join(REFRESH_S)
                    live.update(live_view(progress.refresh(), problem, total, timed,
                                          started))
        except KeyboardInterrupt:
            _say("stopping: cancelling the flow run and shutting down the workers ...")
            _cancel_flow_run(tag)
            progress.refresh()
            measured = progress.by_outcome().get("measured", 0)
            _say(f"stopped. recorded {progress.total()} attempts of run {run_id} "
                 f"({measured} measured) in {settings.warehouse_root}; they stay there")
            if progress.total():
                console.print(summary_table(progress))
            _say(f"look at them: {_sql_hint(run_id)}")
            _say(f"continue it: cake evolve {problem} --resume {run_id}")
            raise typer.Exit(130) from None

        progress.refresh()
        if progress.total():
            console.print(summary_table(progress))
        _say(f"best: {best_text(progress, timed)}")
        for line in baseline_lines(progress):
            _say(line)
        summary = outcome.get("value")
        if isinstance(summary, dict) and summary.get("stop_reason"):
            _say(f"stopped: {summary['stop_reason'].replace('_', ' ')} after {summary.get('attempts')} attempts")
        _print_where(settings, pf.ui_url, run_id)
        _say(f"ask: {_sql_hint(run_id)}")
        if "error" in outcome:
            raise outcome["error"]


def _harness_exists(settings: Settings, version: int) -> None:
    """A UsageError unless harness version ``version`` is in the warehouse (0, the built-in one, always is)."""
    have = {0}
    if settings.warehouse_root.exists():
        from tasks.history import harness_versions

        have = harness_versions(str(settings.warehouse_root))
    if version not in have:
        raise UsageError(f"--harness {version}: the warehouse {settings.warehouse_root} holds harness versions "
                         f"{', '.join(map(str, sorted(have)))}; `cake harness versions` lists them")


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
def problems() -> None:
    """List the problems in the kernel corpus and their shape sets."""
    from cake_core.problems import list_problems

    t = Table(header_style="bold")
    t.add_column("problem")
    t.add_column("description")
    t.add_column("shape sets")
    for p in list_problems():
        t.add_row(p.name, p.description, ", ".join(p.shape_sets))
    console.print(t)


# ---------------------------------------------------------------- cake harness


@harness_app.command("proposals")
@cli_errors
def harness_proposals() -> None:
    """List harness proposals with their latest state."""
    print_result(console, _warehouse(_settings()).query(f"select * from {PROPOSALS_VIEW}"),
                  empty="no proposals yet")


def _decide(proposal_id: str, approve: bool, reason: str) -> None:
    settings = _settings()
    from flows.harness import decide_proposal

    with prefect_server(settings):  # a paused review flow is resumed through the Prefect API
        result = decide_proposal(proposal_id, approve=approve, reason=reason,
                                 decided_by=getpass.getuser(),
                                 warehouse_root=str(settings.warehouse_root))
    said = f"{'approved' if approve else 'rejected'} proposal {proposal_id}"
    if isinstance(result, int) and not isinstance(result, bool):  # the new harness version
        said += f": harness version {result} created"
    elif isinstance(result, str) and result:
        said += f": {result}"
    _say(said)


@harness_app.command("approve", no_args_is_help=True)
@cli_errors
def harness_approve(
    proposal_id: str = typer.Argument(..., metavar="ID", help="Proposal id (see `cake harness proposals`)."),
    reason: str = typer.Option("", "--reason", help="Why (kept with the decision)."),
) -> None:
    """Approve a proposal: it becomes part of a new harness version."""
    _decide(proposal_id, True, reason)


@harness_app.command("reject", no_args_is_help=True)
@cli_errors
def harness_reject(
    proposal_id: str = typer.Argument(..., metavar="ID", help="Proposal id (see `cake harness proposals`)."),
    reason: str = typer.Option(..., "--reason", help="Why (required; kept with the decision)."),
) -> None:
    """Reject a proposal, with the reason."""
    if not reason.strip():
        raise UsageError("--reason must say why the proposal is rejected")
    _decide(proposal_id, False, reason)


@harness_app.command("review")
@cli_errors
def harness_review(
    min_support: int = typer.Option(3, "--min-support", min=1,
                                    help="Failing attempts a cluster needs before a proposal is mined."),
    timeout_h: float = typer.Option(24.0, "--timeout-h", min=0.01, help="How long each proposal waits for a person."),
    policy: str = typer.Option("manual", "--policy",
                               help="Who decides what passed the corpus gate: manual (pause for a person), "
                                    "approve-gated (approve it at once) or record-only (leave it pending)."),
) -> None:
    """Mine the warehouse into proposals (rules, primitives, calibrations, macro tactics), gate each on the
    kernel corpus, and pause on each until a person decides.

    Approve or reject in the Prefect UI (the paused run asks for a decision), or from
    another terminal with `cake harness approve ID` / `cake harness reject ID --reason R`.
    """
    from flows.harness import POLICIES
    if policy not in POLICIES:
        raise UsageError(f"--policy must be one of {', '.join(POLICIES)}, not `{policy}`")
    settings = _settings()
    _warehouse(settings)
    with prefect_server(settings) as pf:
        from flows.harness import harness_review_flow

        _say(f"reviewing failure clusters in {settings.warehouse_root}; paused proposals wait in "
             f"the Prefect UI at {pf.ui_url} or for `cake harness approve ID`")
        gpus = gpu_policy(settings)     # where there is a GPU, the corpus gate checks the corpus on it too
        results = harness_review_flow(warehouse_root=str(settings.warehouse_root), min_support=min_support,
                                      pause_timeout_s=int(timeout_h * 3600), policy=policy,
                                      gpu_cache_dir=str(settings.cache_dir) if gpus else None)
    if not results:
        _say("no cluster yielded a proposal")
    for r in results:
        extra = f", harness version {r['new_version']}" if r.get("new_version") else ""
        _say(f"proposal {r['proposal_id']}: {r['decision']}{extra}")


@harness_app.command("versions")
@cli_errors
def harness_versions() -> None:
    """List harness versions, newest last."""
    print_result(console, _warehouse(_settings()).query(VERSIONS_QUERY),
                  empty="no harness versions yet")


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
    from cake_core.ir.check import check_file

    diagnostics = list(check_file(str(file), target=target))
    n_err = sum(1 for d in diagnostics if d.is_error)
    if as_json:
        sys.stdout.write(json.dumps({"file": str(file), "target": target, "errors": n_err,
                                     "diagnostics": [d.to_dict() for d in diagnostics]},
                                    indent=1) + "\n")
    else:
        source = file.read_text()
        for d in diagnostics:
            typer.echo(d.format(str(file), source))
        n_other = len(diagnostics) - n_err
        typer.echo(f"{file}: {n_err} error(s), {n_other} other diagnostic(s)" if diagnostics
                   else f"{file}: ok")
    if n_err:
        raise typer.Exit(1)


# ---------------------------------------------------------------- cake run / cake ops


@app.command(no_args_is_help=True)
@cli_errors
def run(
    file: Path = typer.Argument(..., metavar="FILE.cake", help="Cake IR file to run."),
    problem: str = typer.Option(..., "--problem", help="Problem whose oracle judges the output."),
    shape: list[str] = typer.Option(..., "--shape", help="A shape such as M=96,N=80,K=72 (repeatable)."),
    cpu: bool = typer.Option(True, "--cpu/--no-cpu", help="Run on the CPU interpreter (the only backend here)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
) -> None:
    """Run an IR file on the CPU interpreter against a problem's oracle; exit 1 if any shape is wrong."""
    if not cpu:
        raise UsageError("only --cpu is available from `cake run`; GPU runs go through `cake evolve`")
    _ir_file(file)
    from cake_core.problems import get_problem
    from cake_core.problems.base import parse_shape_key
    from cake_core.runtime.cpu import run_file

    prob = get_problem(problem)
    shapes = [parse_shape_key(s, prob.dims) for s in shape]
    checks = run_file(file, problem, shapes, seed=seed)
    t = Table(title=f"{file} on {problem} (CPU interpreter)")
    for col in ("shape", "correct", "max rel error", "message"):
        t.add_column(col)
    for c in checks:
        t.add_row(c.shape, "yes" if c.correct else "NO", "" if c.max_error is None else f"{c.max_error:.3g}",
                  c.message)
    console.print(t)
    if not all(c.correct for c in checks):
        raise typer.Exit(1)


@app.command()
@cli_errors
def ops() -> None:
    """Print the Cake IR reference (every op, its types, preconditions, example and guarding rules)."""
    from cake_core.ir.reference import render_reference

    sys.stdout.write(render_reference())


from cake_cli.model_cli import model_app  # noqa: E402  (its commands use the helpers above)
app.add_typer(model_app, name="model")

if __name__ == "__main__":
    app()
