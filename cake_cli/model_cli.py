"""``cake model ...``: land bench measurements, fit and grade cost models.

    cake model import-bench bench/results/corpus-vs-peers-*.json   # measurements -> warehouse runs
    cake model export-samples --out bench/results/samples/NAME.parquet   # a home's measured samples, durable
    cake model import-bench bench/results/samples/*.parquet        # ... landed again in another home
    cake model eval [--split run|time] [--model FILE] [--out FILE.json]
    cake model fit --out model.json [--split run|time]             # learned model + held-out comparison
    cake model show FILE

Errors are one line (``cli_errors``); a model file that cannot be used says why and the analytic model
stands in.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import out_file
from cake_cli.invocation import settings as _settings

model_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                        help="Cost models: import bench measurements, fit, evaluate on held-out runs.")

def _measured_sql(where: str) -> str:
    """Every correct search measurement with its kernel's text, run and ptxas report, narrowed by ``where``."""
    return f"""
with c as (
    select attempt_id, any_value(registers) as registers, any_value(spill_bytes) as spill_bytes,
           any_value(smem_bytes) as smem_bytes
    from compiles where ok group by attempt_id
)
select m.run_id, a.problem, r.started_at, m.attempt_id, a.ir_text, m.shape, m.gpu_model, m.timer, m.l2,
       m.median_ms, m.p10_ms, m.p90_ms, m.runs, c.registers, c.spill_bytes, c.smem_bytes
from measurements m
join attempts a using (attempt_id)
left join runs_latest r on r.run_id = m.run_id
left join c using (attempt_id)
where m.correct and m.kind = 'search' and {where}
order by m.run_id, m.attempt_id, m.shape
"""


SAMPLES_SQL = _measured_sql("m.timer = ?")                              # what the models are graded on
EXPORT_SQL = _measured_sql("r.agent not in ('corpus', 'samples')")      # an evolution run's own, to keep


def _wh(create: bool = False):
    from warehouse import Warehouse

    root = _settings().warehouse_root
    if not root.exists() and not create:
        raise UsageError(f"no warehouse at {root} yet; land measurements with `cake model import-bench FILE...` "
                         f"or run `cake evolve` first")
    return Warehouse(root)


def _samples(gpu: str, timer: str):
    from cake_core.model.evaluate import dedupe, samples_from_rows
    from cake_core.targets import gpu_for_name

    rows = [r for r in _wh().query(SAMPLES_SQL, [timer]).to_pylist() if gpu_for_name(r["gpu_model"]) == gpu]
    samples, bad = samples_from_rows(rows, gpu)
    for line in bad[:5]:
        _say(f"note: {line}")
    if len(bad) > 5:
        _say(f"note: {len(bad) - 5} more attempts whose text does not parse were left out")
    return dedupe(samples)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}" if math.isfinite(x) else "-"
    return str(x)


def _table(results: dict[str, dict[str, dict[str, Any]]]) -> Table:
    from cake_core.model.evaluate import LARGE_CELL

    t = Table(header_style="bold")
    for c in ("model", "problem", "samples", "cells", "spearman (cells)", f"spearman, cells of {LARGE_CELL}+",
              "top-1", "best survives", "error x"):
        t.add_column(c, justify="left" if c in ("model", "problem") else "right")
    for model, per in results.items():
        for problem, f in per.items():
            t.add_row(model, problem, str(f["samples"]), str(f["cells"]),
                      f"{_fmt(f['spearman'], 2)} ({f['spearman_cells']})",
                      f"{_fmt(f['spearman_large'], 2)} ({f['spearman_large_cells']})", _fmt(f["top1"], 2),
                      _fmt(f["best_survives"], 2), _fmt(f["error_factor"], 2))
    return t


@model_app.command("import-bench", no_args_is_help=True)
@cli_errors
def import_bench(
    files: list[Path] = typer.Argument(..., help="corpus_vs_peers JSON result files, or sample files (.parquet) "
                                                 "of `cake model export-samples`"),
    check: bool = typer.Option(True, "--check/--no-check",
                               help="match each program's text to the recorded ptxas report (needs nvcc)"),
) -> None:
    """Land the measurements of bench result files as warehouse runs (one per file and problem), and those of
    sample files as the runs they were measured in."""
    from cake_core.lower.compile import nvcc_path
    from cake_core.model.bench_import import (BenchFileError, ptxas_check, read_bench_file, resolve_texts,
                                              sample_rows, warehouse_rows)

    settings = _settings()
    wh = _wh(create=True)
    checker = ptxas_check(settings.cache_dir) if check and nvcc_path() else None
    if check and checker is None:
        _say("note: nvcc not found: program texts are not checked against the recorded ptxas reports")
    have = {r["run_id"] for r in wh.query("select distinct run_id from runs").to_pylist()}
    for f in files:
        bf = None
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq
            try:
                records = pq.read_table(f).to_pylist()
            except (OSError, ValueError) as e:
                raise BenchFileError(f"{f}: not a Parquet sample file ({e})") from None
            rows = sample_rows(records, f.stem)
        else:
            bf = read_bench_file(f)
            resolve_texts(bf, checker)
            rows = warehouse_rows(bf)
        new = [r for r in rows["runs"] if r["run_id"] not in have]
        if not new:
            _say(f"{f}: already imported ({len(rows['runs'])} runs), nothing landed")
            continue
        keep = {r["run_id"] for r in new}
        aids = {a["attempt_id"] for a in rows["attempts"] if a["run_id"] in keep}
        # child rows first, runs last: a run listed in `runs` has all its rows
        for table in ("compiles", "measurements", "attempts", "runs"):
            batch = [r for r in rows[table] if (r["attempt_id"] in aids if table == "compiles" else r["run_id"] in keep)]
            if batch:
                wh.append(table, batch)
        have |= keep
        left = [p for p in bf.programs.values() if p.text is None] if bf is not None else rows["left_out"]
        _say(f"{f}: {len(new)} runs, {sum(1 for a in rows['attempts'] if a['run_id'] in keep)} attempts, "
             f"{sum(1 for m in rows['measurements'] if m['run_id'] in keep)} measurements"
             + (f"; {len(left)} programs left out" if left else ""))
        for p in (bf.programs.values() if bf is not None else ()):
            if p.note:
                _say(f"  {p.key}: {p.note}")
        for x in (rows["left_out"] if bf is None else ()):
            _say(f"  {x['attempt_id']}: {x['why']}")


@model_app.command("export-samples", no_args_is_help=True)
@cli_errors
def export_samples(
    out: Path = typer.Option(..., "--out", help="the Parquet file to write (e.g. bench/results/samples/NAME.parquet)"),
    run: list[str] = typer.Option([], "--run", help="only these runs (default: every evolution run of the home)"),
) -> None:
    """Write the home's measured samples (each correct search measurement with its kernel's IR text and ptxas
    report) to one Parquet file: a few kilobytes per run that `cake model import-bench` lands in another home,
    so a model's held-out figures can be recomputed after the warehouse that measured them is gone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = _wh().query(EXPORT_SQL).to_pylist()
    if run:
        unknown = sorted(set(run) - {r["run_id"] for r in records})
        if unknown:
            raise UsageError(f"no measured samples of run {', '.join(unknown)} in this home; "
                             f"`cake sql \"select distinct run_id from measurements\"` lists those there are")
        records = [r for r in records if r["run_id"] in set(run)]
    if not records:
        raise UsageError("no measured samples of an evolution run in this home; run `cake evolve` on a GPU first")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), out, compression="zstd")
    _say(f"{out}: {len(records)} samples of {len({r['run_id'] for r in records})} runs, "
         f"{len({r['attempt_id'] for r in records})} kernels ({out.stat().st_size // 1024} KiB)")


def _evaluate(gpu: str, timer: str, split: str, keep: float, model_file: Path | None) -> dict[str, Any]:
    from cake_core.model.analytic import AnalyticModel
    from cake_core.model.artifact import load_model
    from cake_core.model.evaluate import compare, folds, grade, held_out, report
    from cake_core.model.learned import LearnedModel

    samples = _samples(gpu, timer)
    if not samples:
        raise UsageError(f"no correct {timer} search measurements of a {gpu} in the warehouse; "
                         "import some with `cake model import-bench` or run `cake evolve` on a GPU")
    analytic = grade(AnalyticModel(gpu), samples)
    fitted, fit_notes = held_out(lambda tr: AnalyticModel(gpu).update(tr), samples, split)
    learned, notes = held_out(lambda tr: LearnedModel(gpu).update(tr), samples, split)
    results = {"analytic": report(analytic, keep), "analytic-refit": report(fitted, keep),
               "learned": report(learned, keep)}
    out: dict[str, Any] = {
        "gpu": gpu, "timer": timer, "split": split, "keep": keep, "samples": len(samples),
        "runs": len({s.run_id for s in samples}), "folds": len(folds(samples, split)),
        "results": results, "comparison": compare(analytic, learned, keep), "notes": fit_notes + notes,
        "_samples": samples}
    if model_file is not None:
        model = load_model(model_file, gpu)
        trained = set(getattr(model, "trained_on", {}).get("run_ids", []))
        unseen = [s for s in samples if s.run_id not in trained]
        if unseen:
            out["results"][f"file:{model.version}"] = report(grade(model, unseen), keep)
        else:
            out["notes"].append(f"{model_file} was fitted on every run here: no held-out run to grade it on")
        out["model_file"] = {"path": str(model_file), "graded_on_runs": len({s.run_id for s in unseen}),
                             "left_out_trained_runs": len(trained)}
    return out


def _split_line(split: str, runs: int, folds: int) -> str:
    from cake_core.model.evaluate import TIME_HOLDOUT

    if split == "run":
        return (f"held-out split: leave-one-run-out cross validation over {runs} runs ({folds} folds); a training "
                f"fold never holds a (program, shape) its test run measured")
    return f"held-out split: by time, fitted on the earlier runs, graded on the latest {TIME_HOLDOUT:.0%} ({runs} runs)"


@model_app.command("eval")
@cli_errors
def eval_(
    split: str = typer.Option("run", "--split", help="run: leave-one-run-out; time: latest runs held out"),
    gpu: str = typer.Option("H200", "--gpu", help="GPU whose measurements are graded"),
    timer: str = typer.Option("cuda_event", "--timer", help="cuda_event or cuda_graph"),
    keep: float = typer.Option(0.5, "--keep", help="the filter's keep share for 'best survives'"),
    model_file: Path | None = typer.Option(None, "--model", help="also grade this model file on runs it was not "
                                           "fitted on"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write the figures as JSON here"),
) -> None:
    """Grade the cost models on held-out runs: within-shape Spearman, top-1, best survives, error factor."""
    from cake_core.model.charges import load_gpu
    from cake_core.model.evaluate import SPLITS

    if split not in SPLITS:
        raise UsageError(f"--split {split}: use one of {', '.join(SPLITS)}")
    if not 0 < keep <= 1:
        raise UsageError(f"--keep {keep}: a share in (0, 1]")
    try:
        gpu = load_gpu(gpu)["name"]
    except KeyError as e:
        raise UsageError(str(e).strip("'\"")) from None
    out_file(out)
    res = _evaluate(gpu, timer, split, keep, model_file)
    res.pop("_samples")
    _say(f"{res['samples']} measured (program, shape) samples of {gpu} in {res['runs']} runs, timer {timer}")
    _say(_split_line(split, res["runs"], res["folds"]))
    Console(highlight=False, width=140).print(_table(res["results"]))   # wide: the table is committed as text
    for n in res["notes"]:
        _say(f"note: {n}")
    c = res["comparison"]
    _say(f"learned vs analytic: {c['summary']}: {'learned model would be used' if c['learned_wins'] else 'the analytic model stays'}")
    _say(_per_problem_line(c))
    if out is not None:
        out.write_text(json.dumps(res, indent=1, default=str) + "\n")
        _say(f"wrote {out}")


@model_app.command("fit", no_args_is_help=True)
@cli_errors
def fit(
    out: Path = typer.Option(..., "--out", "-o", help="model file to write"),
    split: str = typer.Option("run", "--split", help="how the held-out comparison is made: run or time"),
    gpu: str = typer.Option("H200", "--gpu", help="GPU whose measurements it learns"),
    timer: str = typer.Option("cuda_event", "--timer"),
) -> None:
    """Fit the learned model on every measurement of GPU, compare it with the analytic one on held-out runs,
    save it with that comparison (it is used only if it won) and record the version in the warehouse."""
    from cake_core.model.artifact import save_model
    from cake_core.model.learned import LearnedModel

    out_file(out)
    res = _evaluate(gpu, timer, split, 0.5, None)
    model = LearnedModel(gpu).update(res.pop("_samples"))
    model = model.with_comparison(res["comparison"] | {"split": split, "results": res["results"]})
    save_model(model, out)
    _wh().append("model_versions", [{
        "version": model.version, "kind": model.kind, "gpu": gpu, "target": model.target, "path": str(out),
        "split": split, "trained_on": json.dumps(model.trained_on),
        "evaluation": json.dumps(res["results"], default=str), "beats_analytic": model.beats_analytic}])
    _say(f"wrote {out}: {model.version} fitted on {model.trained_on['samples']} samples of "
         f"{model.trained_on['runs']} runs")
    _say(f"{res['comparison']['summary']}: "
         f"{'runs will use it' if model.beats_analytic else 'runs will keep the analytic model'}")
    _say(_per_problem_line(res["comparison"]))


def _per_problem_line(c: dict) -> str:
    """Which problems' runs a learned model serves: those where it beat the analytic one on their own cells."""
    won, per = c.get("problems_won", []), c.get("per_problem", {})
    lost = [p for p in per if p not in won]
    return (f"per problem: learned model used for {', '.join(won) or 'none'}; analytic kept for "
            f"{', '.join(lost) or 'none'}")


@model_app.command("show", no_args_is_help=True)
@cli_errors
def show(file: Path = typer.Argument(..., help="a model file")) -> None:
    """Print a model file's header: kind, version, GPU, training data, held-out comparison."""
    from cake_core.model.artifact import read_header

    h = read_header(file)
    for k in ("kind", "version", "gpu", "target", "schema_hash", "created_at", "beats_analytic"):
        if k in h:
            _say(f"{k}: {h[k]}")
    if h.get("trained_on"):
        t = dict(h["trained_on"])
        t.pop("run_ids", None)
        _say(f"trained_on: {json.dumps(t)}")
    if h.get("evaluation", {}).get("summary"):
        _say(f"held-out: {h['evaluation']['summary']}")
