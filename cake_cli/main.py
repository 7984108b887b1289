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
import datetime as dt
import enum
import getpass
import io
import json
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cake_cli.config import ConfigError, Settings, load_settings
from cake_cli.display import columns_rows, console, print_result, to_arrow
from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors, remember_home
from cake_cli.evolve_run import Stopped, exit_now, run_evolution, terminate
from cake_cli.services import gpu_policy, preflight, prefect_server
from cake_core.errors import CakeError

app = typer.Typer(name="cake", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Cake evolves fast GPU kernels written in Cake IR.")
harness_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                          rich_markup_mode=None,
                          help="Review harness proposals and list harness versions.")
app.add_typer(harness_app, name="harness")

WORKER_STOP_S = 20.0       # a stopped worker may finish handing back its flow runs this long
# What a person reviewing proposals needs on one screen; the JSON evidence is one `cake sql` away.
PROPOSALS_QUERY = ("select proposal_id, kind, status, title, created_at from proposals_latest "
                   "order by created_at, proposal_id")
VERSIONS_QUERY = ("select version, parent, proposal_id, created_at from harness_versions "
                  "order by version")

_settings_cache: list[Settings] = []   # the settings of this invocation, once loaded


# ---------------------------------------------------------------- settings


def _settings() -> Settings:
    """Load and validate the configuration once per invocation."""
    if not _settings_cache:
        _settings_cache.append(load_settings())
        remember_home(_settings_cache[0].home)
    return _settings_cache[0]


@app.callback()
@cli_errors
def _startup() -> None:
    """Cake evolves fast GPU kernels written in Cake IR."""
    # Validate the configuration before any command runs, so a typo fails first and alone.
    _settings_cache.clear()
    remember_home(None)
    _settings()
    # A SIGTERM (a scheduler, `timeout`) unwinds like Ctrl-C would: the services this process
    # started (the Prefect server, Ray) are stopped on the way out instead of left running.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


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
                                      help="Shape set to tune on: a name under datasets/shapes/ or a path to a CSV "
                                           "file (default: the problem's first set). Its held-out rows are "
                                           "measured for the final best only, never selected on."),
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
    no_filter: bool = typer.Option(False, "--no-filter", help="Time every candidate that compiled (the cost model "
                                                              "still predicts, and is graded on all of them)."),
    keep: int | None = typer.Option(None, "--keep", min=1, metavar="N",
                                    help="Candidates per generation the cost filter passes by predicted rank "
                                         "(default: half the population); one more predicted best on some one "
                                         "shape and one sampled at random from those it drops are timed too."),
    cost_model: Path | None = typer.Option(None, "--cost-model", metavar="FILE",
                                           help="Rank with this model file (cake model fit); a file that does not "
                                                "load, or a learned model that did not beat the analytic one on "
                                                "held-out runs, falls back to the analytic model."),
) -> None:
    """Evolve kernels for PROBLEM with a live display.

    Every attempt lands in the warehouse; the run also shows in the Prefect UI.
    Ctrl-C (or SIGTERM) stops it between stages and records it as cancelled.
    """
    settings = _settings()
    if no_filter and keep is not None:
        raise UsageError("--keep sets how many candidates the cost filter passes; --no-filter passes them all: "
                         "give one or the other")
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
    from cake_core.problems.base import is_shape_file

    prob = get_problem(problem)
    local_gpus, gpu_models = _gpus_asked(settings)
    timed = bool(gpu_models)
    preflight(settings, agent or "tactic", gpu_models)
    asked: dict[str, Any] = dict(generations=generations, population=population, seed=seed, agent=agent,
                                 cold=True if cold else None, harness_version=harness,
                                 budget_candidates=budget_candidates, budget_gpu_minutes=budget_gpu_minutes,
                                 patience=patience, check_shape_set=check_shapes,
                                 cost_filter=False if no_filter else None, filter_keep=keep)
    from tasks.run_control import mark_crashed

    crashed = mark_crashed(settings.warehouse_root) if settings.warehouse_root.exists() else []
    if crashed:
        _say(f"marked {len(crashed)} run(s) whose process died as crashed: {', '.join(crashed)}")
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
        if is_shape_file(shape_set):   # the flow may run elsewhere: hand it the file, not the cwd
            shape_set = str(Path(shape_set).expanduser().absolute())
        if check_shapes is not None:
            load_shape_set(prob, check_shapes)
            if is_shape_file(check_shapes):
                check_shapes = asked["check_shape_set"] = str(Path(check_shapes).expanduser().absolute())
        if harness:
            _harness_exists(settings, harness)
        run_id = f"{problem}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        shown = dict(generations=generations or DEFAULT_GENERATIONS, population=population or DEFAULT_POPULATION,
                     seed=seed or 0, agent=agent or "tactic", cold=cold)
    total = shown["generations"]
    what = f"resuming run {run_id}" if resume else f"run {run_id}"
    start_line = (f"{what}: {problem} on {shape_set}, {total} generations x {shown['population']}, seed "
                  f"{shown['seed']}, agent {shown['agent']}{', cold' if shown['cold'] else ''}, "
                  f"{', '.join(gpu_models) if gpu_models else 'CPU only (checked, not timed)'}")
    kwargs: dict[str, Any] = dict(
        problem=problem, shape_set=shape_set if not resume else shapes, generations=generations,
        population=population, seed=seed, run_id=run_id, warehouse_root=str(settings.warehouse_root),
        cache_dir=str(settings.cache_dir), gpu_models=list(gpu_models), gpu_count=settings.gpu_count)
    kwargs["agent"] = agent
    for k in ("cold", "harness_version", "budget_candidates", "budget_gpu_minutes", "patience",
              "check_shape_set", "cost_filter", "filter_keep"):
        if asked[k] is not None:
            kwargs[k] = asked[k]
    if resume:
        kwargs["resume"] = resume
    if debug:
        kwargs["debug"] = True
    if cost_model is not None:
        kwargs["cost_model"] = str(cost_model.resolve())
    if shown["agent"] == "llm":
        kwargs["llm"] = {"base_url": settings.llm_base_url, "model": settings.llm_model,
                         "api_key_env": settings.llm_api_key_env}
    try:
        run_evolution(settings, problem, run_id, kwargs, start_line, total, gpu_models, local_gpus)
    except Stopped:
        if _STANDALONE:
            # The services are down and the count is said. The exit hooks left would only wait:
            # Prefect's, to send a stopped flow's last events to a server that is gone.
            exit_now(130)
        raise typer.Exit(130) from None


_STANDALONE = False   # True in the `cake` process itself (main()); False when a test invokes `app`


# ---------------------------------------------------------------- cake server / deploy / worker


@app.command()
@cli_errors
def server() -> None:
    """Keep this home's Prefect server and UI up until Ctrl-C.

    Runs started meanwhile share it; it stops once the last of them ends.
    """
    settings = _settings()
    preflight(settings)
    try:
        with prefect_server(settings) as pf:
            if pf.note:
                _say(pf.note)
            _say(f"Prefect UI: {pf.ui_url}  (API {pf.api_url}, database in {settings.prefect_home})")
            _say("Ctrl-C to leave it; it stops once no run uses it any more")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        _say("left the Prefect server")


@app.command()
@cli_errors
def deploy(
    file: Path | None = typer.Option(None, "--file", metavar="PREFECT.YAML",
                                     help="Deployments to register (default: the repository's prefect.yaml)."),
) -> None:
    """Register prefect.yaml's deployments and their work pool.

    On this home's Prefect server; then `cake worker` runs them (scheduled
    ones, and those started from the UI).
    """
    settings = _settings()
    from cake_cli.deployments import (REPO_PREFECT_FILE, WORK_POOL, ensure_work_pool, register,
                                      unfilled_templates)

    path = (file or REPO_PREFECT_FILE).expanduser()
    if not path.is_file():
        raise UsageError(f"no deployment file at {path}; pass --file PREFECT.YAML")
    unknown = unfilled_templates(path)
    if unknown:
        raise UsageError(f"{path} uses {', '.join('$' + v for v in unknown)}, which `cake deploy` does not "
                         f"set; write the values into the file")
    preflight(settings)
    with prefect_server(settings) as pf:
        if pf.note:
            _say(pf.note)
        created = ensure_work_pool()
        names = register(path, settings)
    _say(f"work pool {WORK_POOL}: {'created' if created else 'already there'}")
    for n in names:
        _say(f"registered {n}")
    _say("run them: cake worker  (scheduled runs, and runs started from the UI, wait for a worker)")


@app.command()
@cli_errors
def worker() -> None:
    """Run deployed flows: a Prefect worker on the cake work pool.

    Against this home's Prefect server; Ctrl-C stops it.
    """
    import subprocess

    from cake_cli.deployments import WORK_POOL, ensure_work_pool, worker_command

    settings = _settings()
    preflight(settings)
    with prefect_server(settings) as pf:
        if pf.note:
            _say(pf.note)
        ensure_work_pool()
        _say(f"worker on work pool {WORK_POOL}; flow runs start here; Prefect UI: {pf.ui_url}")
        env = {**os.environ, "CAKE_HOME": str(settings.home)}
        proc = subprocess.Popen(worker_command(), env=env, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the worker too (same process group); SIGTERM reached only us: pass it on.
            proc.terminate()
            try:
                proc.wait(WORKER_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _say("worker stopped")
            return
    if code:
        raise CakeError(f"the Prefect worker exited with code {code}")


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
    result = _warehouse(_settings()).query(PROPOSALS_QUERY)
    print_result(console, result, empty="no proposals yet")
    if columns_rows(result)[1]:
        _say("approve:  cake harness approve ID --reason TEXT")
        _say("reject:   cake harness reject ID --reason TEXT")
        _say("evidence: cake sql \"select * from proposals_latest where proposal_id = 'ID'\"")


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
    reason: str = typer.Option(..., "--reason", help="Why (required; kept with the decision)."),
) -> None:
    """Approve a proposal, with the reason: it becomes part of a new harness version."""
    if not reason.strip():
        raise UsageError("--reason must say why the proposal is approved")
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
    """List harness versions, newest last (each also exported as <home>/harness/harness-vN.json)."""
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
) -> None:
    """Run an IR file on the CPU against an oracle.

    The CPU interpreter runs FILE on each --shape against the problem's oracle;
    exit 1 if any shape is wrong. A file that does not verify is not run: its
    diagnostics print as `cake check` prints them.
    """
    if not cpu:
        raise UsageError("only --cpu is available from `cake run`; GPU runs go through `cake evolve`")
    _ir_file(file)
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


from cake_cli.model_cli import model_app  # noqa: E402  (its commands use the helpers above)
app.add_typer(model_app, name="model")
from cake_cli.experiment_cli import experiment_app  # noqa: E402
app.add_typer(experiment_app, name="experiment")
from cake_cli.report import report  # noqa: E402  (it uses the helpers above at call time)
app.command("report", no_args_is_help=True)(report)
from cake_cli.lineage_cli import lineage as _lineage  # noqa: E402
app.command(no_args_is_help=True)(_lineage)


def main() -> None:
    """The `cake` command (the console script): :data:`app` in a process of its own."""
    global _STANDALONE
    _STANDALONE = True
    app()


if __name__ == "__main__":
    main()
