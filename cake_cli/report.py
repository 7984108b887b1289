"""``cake report RUN``: a run's figures and tables as PNG + Markdown, published as a Prefect artifact.

    cake report RUN [--out DIR] [--no-publish]

Writes ``DIR/report.md`` (default ``<home>/reports/RUN``) beside four figures (``cake_cli.report_figures``):
the best kernel over generations (predicted and measured), the speed-up per shape over the hand-written best
and the peer, failure clusters over time, predicted against measured time. Then publishes the Markdown, the
figures inlined, as the artifact ``<run>-report`` on the run's flow run (the local Prefect server, as every
command finds or starts it). The files are written first: a server that cannot be reached loses nothing.
"""
from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import typer

from cake_cli import report_figures as figs
from cake_cli.display import say
from cake_cli.errors import cli_errors
from cake_cli.invocation import settings as load_settings
from cake_cli.invocation import warehouse
from cake_cli.services import prefect_server

FIGURES = (("best_over_generations", "Best kernel over generations", figs.best_over_generations),
           ("speedup_per_shape", "Speed-up per shape", figs.speedup_per_shape),
           ("failure_clusters", "Failure clusters over time", figs.failure_clusters),
           ("predicted_vs_measured", "Predicted against measured time", figs.predicted_vs_measured))
WHY_EMPTY = {"best_over_generations": "no kernel of the run was scored (every candidate failed)",
             "speedup_per_shape": "no hand-written kernel or peer was scored on the run's shapes",
             "failure_clusters": "no attempt of the run failed",
             "predicted_vs_measured": "nothing was measured (a run without a GPU is checked, not timed)"}


def build_report(warehouse_root: str, run_id: str, out: Path) -> tuple[Path, dict[str, Path | None]]:
    """Draw the figures of run ``run_id`` and write ``report.md`` into ``out``; returns its path and each
    figure's (None: nothing to draw, the Markdown says why).

    Raises
    ------
    CakeError
        No run ``run_id`` in the warehouse.
    """
    from cake_core.errors import CakeError
    from tasks import results
    from tasks.artifacts import leaderboard_markdown
    from warehouse.queries import run_best, run_rows

    runs = run_rows(warehouse_root, run_id)
    if not runs:
        raise CakeError(f"no run `{run_id}` in {warehouse_root}; `cake sql \"select run_id, problem, status "
                        f"from runs_latest\"` lists the runs")
    out.mkdir(parents=True, exist_ok=True)
    data = {"best_over_generations": results.convergence_rows(warehouse_root, run_id),
            "speedup_per_shape": results.shape_rows(warehouse_root, run_id),
            "failure_clusters": results.failure_rows(warehouse_root, run_id),
            "predicted_vs_measured": results.prediction_rows(warehouse_root, run_id)}
    drawn = {name: draw(data[name], out / f"{name}.png") for name, _, draw in FIGURES}
    r = runs[0]
    lines = [f"# Report of run {run_id}", "",
             f"{r['problem']} on `{r['shape_set']}`, harness v{r['harness_version']}, "
             f"{'cold' if r.get('cold') else 'warm'} start, agent {r['agent']}, seed {r['seed']}, "
             f"{'GPU ' + r['gpu_model'] if r['gpu_model'] else 'no GPU (checked on the interpreter, not timed)'}; "
             f"status {r['status']}" + (f" ({r['stop_reason']})" if r.get("stop_reason") else "") + ".", ""]
    for name, title, _ in FIGURES:
        lines += [f"## {title}", ""]
        lines += [f"![{title}]({name}.png)"] if drawn[name] else [f"Not drawn: {WHY_EMPTY[name]}."]
        lines.append("")
    best = run_best(warehouse_root, run_id)
    lines.append(leaderboard_markdown(run_id, results.leaderboard_rows(warehouse_root, run_id),
                                      data["speedup_per_shape"], best["ir_text"] if best else None, level=2))
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path, drawn


def inline_figures(markdown: str, folder: Path) -> str:
    """``markdown`` with each ``![..](NAME.png)`` of ``folder`` inlined as a data URI (the UI cannot read the
    report's folder)."""
    def inline(m: re.Match) -> str:
        png = folder / m.group(2)
        data = base64.b64encode(png.read_bytes()).decode() if png.is_file() else None
        return f"![{m.group(1)}](data:image/png;base64,{data})" if data else m.group(0)
    return re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", inline, markdown)


def publish(run_id: str, markdown: str, flow_run_id: str | None) -> str:
    """Create the artifact ``<run>-report`` on the current Prefect API, on the run's flow run when that
    server knows it; returns the artifact's key."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    from tasks.artifacts import artifact_key

    key = artifact_key(run_id, "report")
    with get_client(sync_client=True) as client:
        run = None
        if flow_run_id:
            try:
                run = client.read_flow_run(flow_run_id).id
            except Exception:  # noqa: BLE001 - a run of another server: the report stands alone
                run = None
        client.create_artifact(ArtifactCreate(key=key, type="markdown", data=markdown, flow_run_id=run,
                                              description=f"run {run_id}: report"))
    return key


def report(
    run_id: str = typer.Argument(..., metavar="RUN", help="The run's id (see `cake sql \"select * from runs_latest\"`)."),
    out: Path = typer.Option(None, "--out", help="Folder for report.md and the PNGs (default <home>/reports/RUN)."),
    publish_it: bool = typer.Option(True, "--publish/--no-publish",
                                    help="Publish the report as a Prefect artifact on the run's flow run."),
) -> None:
    """Write a run's report: figures (PNG) and tables (Markdown), published as a Prefect artifact."""
    cli_errors(_report)(run_id, out, publish_it)


def _report(run_id: str, out: Path | None, publish_it: bool) -> None:
    settings = load_settings()
    warehouse(settings)
    folder = out or settings.home / "reports" / run_id
    path, drawn = build_report(str(settings.warehouse_root), run_id, folder)
    say(f"wrote {path} and {sum(1 for p in drawn.values() if p)} figures in {folder}")
    if publish_it:     # after the files: a server that cannot be reached loses nothing
        from warehouse.queries import run_rows
        with prefect_server(settings) as server:
            key = publish(run_id, inline_figures(path.read_text(), folder),
                          run_rows(str(settings.warehouse_root), run_id)[0]["flow_run_id"])
        say(f"published as artifact `{key}` at {server.ui_url}/artifacts/key/{key}")
