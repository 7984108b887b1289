"""``cake experiment ...``: experiments over the evolution loop.

    cake experiment frozen-vs-evolving kmeans_assign --seeds 3 --budget-gpu-minutes 0.5 --block 2 \\
        --approve gate-passing --out bench/results/fve-kmeans
    cake experiment frozen-vs-evolving kmeans_assign --cpu --seeds 1 --budget-candidates 16 --block 1

The flow (``flows.experiment``) runs both arms on the embedded services; the table is printed last and
the report (``frozen-vs-evolving.json`` / ``.md``, stating the approval policy) lands under ``--out``.
The same command with the same ``--out`` continues an experiment a kill or a time limit cut short.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cake_cli.model_cli import UsageError, _say, _settings, cli_errors

experiment_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                             help="Experiments over the evolution loop: frozen-vs-evolving.")


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
    out: Path | None = typer.Option(None, "--out", help="Where the runs' warehouses and the report go (default: "
                                                        "<home>/experiments/PROBLEM-frozen-vs-evolving)."),
) -> None:
    """Frozen (harness v0) against evolving (reviewed between blocks) harness, same agent and budget."""
    from cake_cli.main import _quiet_prefect_console
    from cake_cli.services import gpu_policy, prefect_server, ray_runtime
    from cake_core.problems import get_problem, load_shape_set
    from tasks.experiment import APPROVALS, table

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
    out_dir = (out or settings.home / "experiments" / f"{problem}-frozen-vs-evolving").resolve()
    _say(f"frozen vs evolving: {problem}, {seeds} seed(s) per arm, {'GPU ' + gpu_models[0] if gpu_models else 'CPU'}"
         f" mode, policy {approve}; runs and report under {out_dir}")
    kwargs: dict[str, Any] = dict(problem=problem, out_dir=str(out_dir), seeds=list(range(seeds)), shape_set=shapes,
                                  population=population, block=block, generations=generations,
                                  budget_candidates=budget_candidates, budget_gpu_minutes=budget_gpu_minutes,
                                  approve=approve, gpu_models=gpu_models)
    with prefect_server(settings), ray_runtime(settings, num_gpus=len(gpu_models)):
        _quiet_prefect_console()
        from flows.experiment import frozen_vs_evolving_flow
        report = frozen_vs_evolving_flow(**kwargs)
    s = report["summary"]
    _say(f"policy of the evolving arm: {report['policy']['name']} ({report['policy']['meaning']})")
    _say(f"converged means {report['converged_means']}")
    _say(f"report: {out_dir / 'frozen-vs-evolving.md'} and {out_dir / 'experiment.json'}")
    for arm in ("frozen", "evolving"):
        a = s[arm]
        _say(f"{arm}: {a['converged']}/{a['runs']} converged, {a['gpu_s_failed']} GPU-s on failed candidates "
             f"({a['failed_candidates']} failed candidates)")
    _say(table(report["rows"]))
