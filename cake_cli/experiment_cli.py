"""``cake experiment ...``: experiments over the evolution loop.

    cake experiment frozen-vs-evolving PROBLEM --seeds 3 --budget-gpu-minutes 0.5 --block 2 \\
        --approve gate-passing --out bench/results/fve-PROBLEM
    cake experiment frozen-vs-evolving PROBLEM --cpu --seeds 1 --budget-candidates 16 --block 1
    cake experiment transfer --learned-from HOME --problems P1,P2 --seeds 3 \\
        --budget-gpu-minutes 1 --block 2 --out bench/results/transfer

:func:`run_experiment` drives flows that exist already (``flows.evolve``, ``flows.harness``; a flow module
imports no other flow): per arm and seed one evolve run in blocks of generations, each block a resume of
the run that goes ``block`` generations further. The frozen arm pins harness v0; the evolving arm runs the
harness review over its own warehouse between blocks, decided by the named approval policy, and goes on
under the newest version. The report (``tasks.experiment``) says per run whether it converged and what it
cost, and states the policy; the table is printed last and the report (``frozen-vs-evolving.json`` /
``.md``) lands under ``--out``. The same command with the same ``--out`` continues an experiment a kill or
a time limit cut short.

:func:`run_transfer` runs the transfer experiment the same way (``tasks.transfer``): per problem the harness never
saw and seed, a cold run pinned to harness v0 and one pinned to the approved harness of another home, carried into
its own warehouse.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import typer

from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import settings as _settings

log = logging.getLogger("cake.experiment")


def run_experiment(problem: str, out_dir: str, seeds: list[int], shape_set: str | None = None,
                   population: int = 8, block: int = 2, generations: int | None = None,
                   budget_candidates: int | None = None, budget_gpu_minutes: float | None = None,
                   approve: str = "gate-passing", gpu_models: list[str] | None = None, gate_gpu: bool | None = None,
                   min_support: int = 3, timeout_s: float = 120.0, reps: int = 20,
                   say: Callable[[str], None] = log.info) -> dict[str, Any]:
    """Run (or continue) both arms for every seed and write the report under ``out_dir``; returns it.

    Needs a Prefect API and Ray (the embedded services, as the command starts them). ``say`` gets one line per
    block and per review (what ran, how long it took, the run's best so far): an experiment runs for many
    minutes, and the command prints them as it goes.
    """
    from flows.harness import harness_review_flow
    from tasks.experiment import experiment_plan, harness_for_block, record_review, run_result, write_report

    plan = experiment_plan(problem, shape_set, list(seeds), out_dir, population, block, generations,
                           budget_candidates, budget_gpu_minutes, approve, bool(gpu_models), gate_gpu)
    for run in plan["runs"]:
        root = run["warehouse_root"]

        def reviewed(progress: dict[str, Any], run: dict[str, Any] = run, root: str = root) -> int:
            """The evolving arm reviews its harness between blocks; the version the next block runs under."""
            if run["arm"] == "evolving" and progress["generations"] > 0:
                t0 = time.monotonic()
                decided = harness_review_flow(warehouse_root=root, min_support=min_support,
                                              policy=plan["review_policy"],
                                              gpu_cache_dir=plan["cache_dir"] if plan["gate_gpu"] else None)
                kept = {"arm": run["arm"], "seed": run["seed"], "after_generation": progress["generations"],
                        "decisions": decided, "seconds": round(time.monotonic() - t0, 1)}
                record_review(plan, kept)
                say(f"{run['run_id']}: harness review after generation {progress['generations']}: "
                    f"{_decisions(decided)} ({kept['seconds']} s)")
            return harness_for_block(run["arm"], root)

        _in_blocks(plan, {**run, "problem": plan["problem"], "shape_set": plan["shape_set"]}, reviewed,
                   gpu_models, timeout_s, reps, say)
    rows = [run_result(plan, run) for run in plan["runs"]]
    return write_report(plan, rows)


def _in_blocks(plan: dict[str, Any], run: dict[str, Any], before_block: Callable[[dict[str, Any]], int],
               gpu_models: list[str] | None, timeout_s: float, reps: int, say: Callable[[str], None]) -> None:
    """Take one run of an experiment (``run``: its arm, problem, shape set, seed, id and warehouse) block by block
    to its generations or budget (``tasks.experiment.next_block``), each block a cold evolve run (the first) or a
    resume of it that goes ``plan["block"]`` generations further. ``before_block`` gets the run's progress before
    each block and returns the harness version the block runs under."""
    from flows.evolve import evolve_flow
    from tasks.experiment import next_block, run_progress

    root, rid = run["warehouse_root"], run["run_id"]
    progress = run_progress(root, rid)
    while (target := next_block(plan, progress)) is not None:
        version = before_block(progress)
        t0 = time.monotonic()
        summary = evolve_flow(problem=run["problem"], shape_set=run["shape_set"], generations=target,
                              population=plan["population"], seed=run["seed"],
                              run_id=None if progress["exists"] else rid, resume=rid if progress["exists"] else None,
                              warehouse_root=root, cache_dir=plan["cache_dir"], gpu_models=list(gpu_models or []),
                              timeout_s=timeout_s, reps=reps, cold=True, harness_version=version,
                              budget_candidates=plan["budget_candidates"],
                              budget_gpu_minutes=plan["budget_gpu_minutes"])
        before, progress = progress["generations"], run_progress(root, rid)
        best = summary.get("best_score") if isinstance(summary, dict) else None
        say(f"{rid}: generations {before} -> {progress['generations']} under harness v{version}, "
            f"{progress.get('attempts', '?')} attempts, best "
            f"{'none' if best is None else f'{best:.4g} ms'} ({time.monotonic() - t0:.0f} s)")
        if progress["generations"] <= before:        # the run stopped on its own (see its stop reason)
            log.warning(f"{rid}: the block ended at generation {before}; the run goes no further")
            break


def _decisions(decided: Any) -> str:
    """One line of a review's decisions: ``approved rule 3, refused tactic 4`` (or ``nothing proposed``)."""
    items = decided if isinstance(decided, list) else (decided or {}).get("decisions", [])
    parts = [f"{d.get('decision', '?')} {d.get('kind', '?')} {d.get('proposal_id', '')}".strip()
             for d in items if isinstance(d, dict)]
    return ", ".join(parts) or "nothing proposed"


experiment_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                             help="Experiments over the evolution loop: frozen-vs-evolving, transfer.")


@experiment_app.command("frozen-vs-evolving", no_args_is_help=True)
@cli_errors
def frozen_vs_evolving(
    problem: str = typer.Argument(..., help="Problem to evolve (see `cake problems`)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per arm (0 .. N-1), one cold run each."),
    budget_candidates: int | None = typer.Option(None, "--budget-candidates", min=1,
                                                 help="Attempts per run, the same for both arms."),
    budget_gpu_minutes: float | None = typer.Option(None, "--budget-gpu-minutes", min=0.001,
                                                    help="GPU minutes per run, the same for both arms."),
    block: int = typer.Option(2, "--block", min=1, help="Generations per block (the evolving arm's harness "
                                                        "review runs between blocks)."),
    generations: int | None = typer.Option(None, "--generations", min=1,
                                           help="Generations per run at most (default: what the candidate "
                                                "budget allows, else 12)."),
    population: int = typer.Option(8, "--population", min=1, help="Candidates per generation."),
    approve: str = typer.Option("gate-passing", "--approve", help="The evolving arm's approval policy: "
                                                                  "gate-passing (approve what the corpus gate "
                                                                  "passes)."),
    shapes: str | None = typer.Option(None, "--shapes", metavar="SET", help="Shape set (default: the problem's "
                                                                            "first)."),
    cpu: bool = typer.Option(False, "--cpu", help="CPU mode: checked on the interpreter, scored by the cost "
                                                  "model (no GPU used even where one is)."),
    gate_on_gpu: bool | None = typer.Option(None, "--gate-on-gpu/--gate-on-cpu",
                                            help="The evolving arm's corpus gate replays the corpus on the GPU "
                                                 "too (default in GPU mode), or on the CPU interpreter alone."),
    out: Path | None = typer.Option(None, "--out", help="Where the runs' warehouses and the report go (default: "
                                                        "<home>/experiments/PROBLEM-frozen-vs-evolving)."),
) -> None:
    """Frozen (harness v0) against evolving (reviewed between blocks) harness, same agent and budget."""
    from cake_cli.evolve_run import _quiet_prefect_console
    from cake_cli.services import gpu_policy, prefect_server, ray_runtime
    from cake_core.problems import get_problem, load_shape_set
    from tasks.experiment import APPROVALS, table
    from tasks.gpus import local_resources

    settings = _settings()
    prob = get_problem(problem)
    if shapes is not None:
        load_shape_set(prob, shapes)
    if approve not in APPROVALS:
        raise UsageError(f"--approve {approve!r} is not a policy; use one of {', '.join(APPROVALS)}")
    if budget_candidates is None and budget_gpu_minutes is None and generations is None:
        raise UsageError("give the arms a budget: --budget-candidates N and/or --budget-gpu-minutes M "
                         "(or --generations N)")
    gpu_models = [] if cpu else gpu_policy(settings)
    if not cpu and not gpu_models:
        raise UsageError("no GPU here (or CAKE_GPU=off): pass --cpu for the CPU mode (interpreter as gate, cost "
                         "model as score)")
    if cpu and budget_gpu_minutes is not None:
        raise UsageError("--budget-gpu-minutes needs a GPU; in --cpu mode give --budget-candidates")
    if cpu and gate_on_gpu:
        raise UsageError("--gate-on-gpu needs a GPU; in --cpu mode the corpus gate runs on the interpreter")
    out_dir = (out or settings.home / "experiments" / f"{problem}-frozen-vs-evolving").resolve()
    _say(f"frozen vs evolving: {problem}, {seeds} seed(s) per arm, {'GPU ' + gpu_models[0] if gpu_models else 'CPU'}"
         f" mode, policy {approve}; runs and report under {out_dir}")
    kwargs: dict[str, Any] = dict(problem=problem, out_dir=str(out_dir), seeds=list(range(seeds)), shape_set=shapes,
                                  population=population, block=block, generations=generations,
                                  budget_candidates=budget_candidates, budget_gpu_minutes=budget_gpu_minutes,
                                  approve=approve, gpu_models=gpu_models, gate_gpu=gate_on_gpu)
    with prefect_server(settings), ray_runtime(settings, num_gpus=len(gpu_models),
                                               resources=local_resources(gpu_models)):
        _quiet_prefect_console()
        report = run_experiment(**kwargs, say=_say)
    s = report["summary"]
    _say(f"policy of the evolving arm: {report['policy']['name']} ({report['policy']['meaning']})")
    _say(f"converged means {report['converged_means']}")
    _say(f"report: {out_dir / 'frozen-vs-evolving.md'} and {out_dir / 'experiment.json'}")
    for arm in ("frozen", "evolving"):
        a = s[arm]
        _say(f"{arm}: {a['converged']}/{a['runs']} converged, {a['gpu_s_failed']} GPU-s on failed candidates "
             f"({a['failed_candidates']} failed candidates)")
    if s.get("separates"):
        _say(f"caveat: {s['separates']}")
    _say(table(report["rows"]))


def run_transfer(plan: dict[str, Any], gpu_models: list[str] | None = None, timeout_s: float = 120.0, reps: int = 20,
                 say: Callable[[str], None] = log.info) -> dict[str, Any]:
    """Run (or continue) the transfer experiment ``plan`` (``tasks.transfer.transfer_plan``) and write its report
    under the plan's out dir; returns it. Pair by pair (problem, seed), the frozen arm's run under harness v0, then
    the learned arm's under the carried version, each in its own warehouse; a run already done is left as it is.

    Needs a Prefect API and Ray (the embedded services, as the command starts them); ``say`` gets one line per
    block."""
    from tasks.transfer import prepare_run, run_result, write_report

    for run in plan["runs"]:
        _in_blocks(plan, run, lambda progress, run=run: prepare_run(plan, run), gpu_models, timeout_s, reps, say)
    return write_report(plan, [run_result(plan, run) for run in plan["runs"]])


def _shape_sets(given: list[str]) -> dict[str, str]:
    """``--shapes PROBLEM=SET`` options as a mapping."""
    out: dict[str, str] = {}
    for item in given:
        name, eq, shape_set = item.partition("=")
        if not (eq and name.strip() and shape_set.strip()):
            raise UsageError(f"--shapes {item!r}: give PROBLEM=SET (a shape set of one of --problems)")
        out[name.strip()] = shape_set.strip()
    return out


@experiment_app.command("transfer", no_args_is_help=True)
@cli_errors
def transfer(
    learned_from: Path | None = typer.Option(None, "--learned-from", metavar="HOME",
                                             help="The Cake home (or its warehouse) whose approved harness the "
                                                  "learned arm carries (needed on the first call; a later call with "
                                                  "the same --out keeps the one it recorded)."),
    learned_version: int | None = typer.Option(None, "--learned-version", min=1,
                                               help="Its harness version to carry (default: the newest approved)."),
    problems: str | None = typer.Option(None, "--problems",
                                        help="Problems the harness never saw, comma-separated (default: every "
                                             "problem of `cake problems` the source home never ran)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per arm and problem (0 .. N-1), one cold run each."),
    budget_candidates: int | None = typer.Option(None, "--budget-candidates", min=1,
                                                 help="Attempts per run, the same for both arms."),
    budget_gpu_minutes: float | None = typer.Option(None, "--budget-gpu-minutes", min=0.001,
                                                    help="GPU minutes per run, the same for both arms."),
    block: int = typer.Option(2, "--block", min=1, help="Generations per evolve call (a cut-short experiment "
                                                        "loses at most the block it was in)."),
    generations: int | None = typer.Option(None, "--generations", min=1,
                                           help="Generations per run at most (default: what the candidate "
                                                "budget allows, else 12)."),
    population: int = typer.Option(8, "--population", min=1, help="Candidates per generation."),
    shapes: list[str] = typer.Option([], "--shapes", metavar="PROBLEM=SET",
                                     help="A problem's shape set (repeatable; default: each problem's first)."),
    seed_target: float = typer.Option(1.5, "--seed-target",
                                      help="Where a problem has no hand-written kernel and no measured peer (its "
                                           "CPU mode), the target is this many times the naive seed's speed."),
    cpu: bool = typer.Option(False, "--cpu", help="CPU mode: checked on the interpreter, scored by the cost "
                                                  "model (no GPU used even where one is)."),
    out: Path | None = typer.Option(None, "--out", help="Where the runs' warehouses, the kept harness and the report "
                                                        "go (default: <home>/experiments/transfer)."),
) -> None:
    """Harness v0 against the harness learned from other problems' runs, cold on problems it never saw."""
    from cake_cli.evolve_run import _quiet_prefect_console
    from cake_cli.services import gpu_policy, prefect_server, ray_runtime
    from cake_core.errors import CakeError
    from tasks.gpus import local_resources
    from tasks.transfer import arm_table, transfer_plan

    settings = _settings()
    names = None if problems is None else [p.strip() for p in problems.split(",") if p.strip()]
    if budget_candidates is None and budget_gpu_minutes is None and generations is None:
        raise UsageError("give the arms a budget: --budget-candidates N and/or --budget-gpu-minutes M "
                         "(or --generations N)")
    gpu_models = [] if cpu else gpu_policy(settings)
    if not cpu and not gpu_models:
        raise UsageError("no GPU here (or CAKE_GPU=off): pass --cpu for the CPU mode (interpreter as gate, cost "
                         "model as score)")
    out_dir = (out or settings.home / "experiments" / "transfer").resolve()
    try:                        # what the plan refuses (the problems, the source home, a kept experiment) is usage
        plan = transfer_plan(names, _shape_sets(shapes), list(range(seeds)), str(out_dir), population, block,
                             generations, budget_candidates, budget_gpu_minutes, bool(gpu_models),
                             str(learned_from) if learned_from is not None else None, learned_version, seed_target)
    except CakeError as e:
        raise UsageError(str(e)) from None
    mode = f"GPU {gpu_models[0]}" if gpu_models else "CPU"
    _say(f"transfer: {', '.join(plan['problems'])}, {seeds} seed(s) per arm, {mode} mode; learned arm: harness "
         f"v{plan['learned_version']} of {plan['learned_from']}; runs and report under {out_dir}")
    with prefect_server(settings), ray_runtime(settings, num_gpus=len(gpu_models),
                                               resources=local_resources(gpu_models)):
        _quiet_prefect_console()
        report = run_transfer(plan, gpu_models=gpu_models, say=_say)
    _say(f"converged means {report['converged_means']}")
    _say(f"report: {out_dir / 'transfer.md'} and {out_dir / 'transfer.json'}")
    _say(arm_table(report["summary"]["per_problem"]))
    for g in report["summary"]["goals"]:
        _say(g["line"])
