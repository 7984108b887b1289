"""Land GPU measurements of corpus kernels taken outside an evolve run (``bench/corpus_vs_peers.py``).

The calibration miner learns from measured attempts. A bench run measures every kernel of the corpus on
the GPU with the same protocol as the time stage (``runtime.gpu.check_and_time``) and writes its rows as
JSON; :func:`land_bench_rows` lands each correct (kernel, shape) figure as an attempt that went through
the real verify stage and the cost model's prediction here, and whose time stage is the bench's
measurement, so the warehouse's ``cost_model_error`` view and the review read them like any other.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from cake_core.agents.base import Candidate
from cake_core.harness.gate import kernel_problem
from cake_core.harness.version import HarnessSpec
from cake_core.outcome import Outcome, StageResult
from cake_core.pipeline import Attempt, cost_filter_stage, verify_stage
from cake_core.pipeline.rows import CHILD_TABLES, merge_rows, now
from cake_core.pipeline.verdicts import ShapeVerdict, Timing
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from warehouse import Warehouse


def bench_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every correct measurement of a corpus kernel in ``corpus_vs_peers`` JSON files, the first of each
    (kernel, shape): ``{"file", "shape", "median_ms", "p10_ms", "p90_ms", "runs", "timer", "gpu", "source"}``."""
    seen, out = set(), []
    for path in paths:
        d = json.loads(Path(path).read_text())
        for row in d.get("rows", []):
            for o in row.get("ours", []):
                name = f"{o.get('program')}.cake"
                key = (name, row.get("shape_key"))
                if key in seen or not (o.get("correct") and o.get("median_ms")) or kernel_problem(name) is None:
                    continue
                seen.add(key)
                out.append({"file": name, "shape": row["shape"], "median_ms": float(o["median_ms"]),
                            "p10_ms": float(o.get("p10_ms") or o["median_ms"]),
                            "p90_ms": float(o.get("p90_ms") or o["median_ms"]), "runs": int(o.get("runs") or 20),
                            "timer": o.get("timer", "cuda_event"), "gpu": d.get("gpu") or "NVIDIA H200",
                            "source": Path(path).name})
    return out


def land_bench_rows(warehouse_root: str, rows: list[dict[str, Any]], run_id: str,
                    harness: HarnessSpec = HarnessSpec()) -> int:
    """One measured attempt per row (verified, predicted by ``harness``'s model, timed as the row says).
    Returns how many landed; a kernel the verifier refuses at its row's shape is left out."""
    model = harness.cost_model()
    attempts = []
    for i, r in enumerate(rows):
        problem = get_problem(kernel_problem(r["file"]) or "")
        shape = {d: int(r["shape"][d]) for d in problem.dims}
        a = Attempt(run_id, 0, i, problem.name, harness.version,
                    Candidate(problem.kernel_text(r["file"]), (), "bench", "reference"))
        a.record(verify_stage(a.candidate.text, harness, problem, [shape]))
        if not a.going_on or not a.runs_on(shape_key(shape)):
            continue
        key = shape_key(shape)
        a.record(cost_filter_stage([a.program], [shape], model, 1, 0, 0, seed=i, problem=problem.name)[0])
        timing = Timing(r["median_ms"], min(r["p10_ms"], r["median_ms"]), max(r["p90_ms"], r["median_ms"]), r["runs"],
                        r["timer"], "cold-clean", r["gpu"])
        a.record(StageResult("time", Outcome.MEASURED, value=[ShapeVerdict(key, "gpu", Outcome.MEASURED, None, "",
                                                                          timing)]))
        attempts.append(a)
    gpus = sorted({r["gpu"] for r in rows}) or ["NVIDIA H200"]
    wh = Warehouse(warehouse_root)
    wh.append("runs", [{
        "run_id": run_id, "problem": "corpus", "shape_set": "bench", "harness_version": harness.version,
        "agent": "bench", "seed": 0, "generations": 1, "population": max(len(attempts), 1), "host": "bench",
        "gpu_model": gpus[0], "started_at": now(), "status": "completed", "finished_at": now()}])
    batch = merge_rows(attempts)
    for table in CHILD_TABLES + ("attempts",):
        if batch.get(table):
            wh.append(table, batch[table])
    return len(attempts)
