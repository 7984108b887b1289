"""The frozen-vs-evolving experiment's steps: its plan, each run's progress, the harness between blocks, the report.

Plain functions, not Prefect tasks: the CLI calls them between the flows it runs (the evolve blocks and the
harness reviews are the flow runs the UI shows), and a task run outside a flow run has nowhere to log.

Two arms of cold-start runs of the same tactic agent with the same budget, one run per arm and seed, each in a
warehouse of its own (``OUT/<arm>-s<seed>/warehouse``: a run learns only from its own attempts, and a later
call with the same ``OUT`` resumes where the last one stopped):

- ``frozen``: pinned to harness v0, the built-in one;
- ``evolving``: between blocks of generations a harness review over its warehouse, decided by a named
  approval policy (:data:`APPROVALS`), and the next block goes on under the newest version.

A run *converged* when a kernel it found scores at least 0.9x the speed of the problem's best hand-written
kernel on the run's headline shapes (score <= best / 0.9), both on one basis: measured medians on a GPU
(the final stage times the hand-written kernels of every run, ``baselines``), the cost model's predictions
on the CPU (the same model predicts the hand-written kernels there).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


from cake_core.errors import CakeError
from cake_core.model.base import geomean
from cake_core.problems import get_problem, load_shape_set
from warehouse import Warehouse
from warehouse.queries import harness_versions, run_rows

ARMS = ("frozen", "evolving")
# the experiment's approval policies -> the harness-review flow's policy that decides the same way
APPROVALS = {"gate-passing": "approve-gated"}
POLICY_WORDS = {"gate-passing": "every proposal the corpus gate passes is approved at once, each a new version"}
CONVERGED_AT = 0.9             # of the hand-written best's speed
FAILED = ("compile_failed", "wrong", "runtime_fault", "timeout")     # got past verify, then failed
GPU_FAILED = ("wrong", "runtime_fault", "timeout")                   # ... on a GPU
DEFAULT_GENERATIONS = 12
COLUMNS = ("arm", "seed", "converged", "generations_to_converge", "seconds_to_converge", "gpu_s_to_converge",
           "gpu_s_failed", "failed_candidates", "attempts", "generations", "best_ms", "hand_written_ms",
           "speed_vs_hand_written", "harness_versions", "approved")


def run_id_of(problem: str, arm: str, seed: int) -> str:
    return f"{problem}-{arm}-s{seed}"


def check_budget(seeds: list[int], block: int, population: int, generations: int | None,
                 budget_candidates: int | None, budget_gpu_minutes: float | None, timed: bool) -> None:
    """An experiment's seeds, blocks and budget as the command was given them, or the CakeError saying which is
    wrong (an experiment's runs share them: the same for every arm)."""
    if not seeds:
        raise CakeError("the experiment needs at least one seed; pass --seeds 1 or more")
    for name, v in (("block", block), ("population", population), ("generations", generations),
                    ("budget-candidates", budget_candidates)):
        if v is not None and v < 1:
            raise CakeError(f"--{name} must be at least 1, got {v}")
    if budget_gpu_minutes is not None and not budget_gpu_minutes > 0:
        raise CakeError(f"--budget-gpu-minutes must be above 0, got {budget_gpu_minutes}")
    if budget_gpu_minutes is not None and not timed:
        raise CakeError("--budget-gpu-minutes needs a GPU (CPU mode spends none); give --budget-candidates")


def experiment_plan(problem: str, shape_set: str | None, seeds: list[int], out_dir: str, population: int, block: int,
                    generations: int | None, budget_candidates: int | None, budget_gpu_minutes: float | None,
                    approve: str, timed: bool, gate_gpu: bool | None = None) -> dict[str, Any]:
    """The experiment's runs and limits, checked before anything runs (a CakeError says what to change).
    ``gate_gpu``: the evolving arm's corpus gate also replays the corpus on the GPU (default: when the runs
    are timed on one, as ``cake harness review`` does on a GPU machine)."""
    prob = get_problem(problem)
    shape_set = shape_set or prob.shape_sets[0]
    load_shape_set(prob, shape_set)
    if approve not in APPROVALS:
        raise CakeError(f"unknown approval policy `{approve}` for the evolving arm; use one of "
                        f"{', '.join(APPROVALS)}")
    check_budget(seeds, block, population, generations, budget_candidates, budget_gpu_minutes, timed)
    if gate_gpu is None:
        gate_gpu = timed
    if gate_gpu and not timed:
        raise CakeError("the corpus gate can replay on the GPU only in GPU mode; drop --gate-on-gpu or the --cpu")
    if generations is None:
        generations = (math.ceil(budget_candidates / population) if budget_candidates is not None
                       else DEFAULT_GENERATIONS)
    out = Path(out_dir)
    plan = {"problem": problem, "shape_set": shape_set, "seeds": list(seeds), "out_dir": str(out),
            "population": population, "block": block, "generations": generations,
            "budget_candidates": budget_candidates, "budget_gpu_minutes": budget_gpu_minutes,
            "approve": approve, "review_policy": APPROVALS[approve], "mode": "gpu" if timed else "cpu",
            "gate_gpu": bool(gate_gpu),
            "cache_dir": str(out / "cache"), "runs": []}
    recorded = out / "experiment.json"
    kept: dict[str, Any] = {}
    if recorded.exists():            # a later call continues the same experiment, or says why it cannot
        kept = json.loads(recorded.read_text())
        was = kept["plan"]
        fixed = ("problem", "shape_set", "population", "block", "approve", "mode")
        diff = [k for k in fixed if was.get(k) != plan[k]]
        if diff:
            raise CakeError(f"{out} holds an experiment with other settings ("
                            + ", ".join(f"{k} {was.get(k)!r}, not {plan[k]!r}" for k in diff)
                            + "); pass another --out, or the same settings to continue it")
    for arm in ARMS:
        for seed in seeds:
            root = out / f"{arm}-s{seed}" / "warehouse"
            plan["runs"].append({"arm": arm, "seed": seed, "run_id": run_id_of(problem, arm, seed),
                                 "warehouse_root": str(root)})
    out.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps({**kept, "plan": plan}, indent=1, default=str))
    return plan


def run_progress(warehouse_root: str, run_id: str) -> dict[str, Any]:
    """How far a run of the experiment went: generations done, attempts, GPU-seconds, its harness version."""
    if not Path(warehouse_root).exists() or not run_rows(warehouse_root, run_id):
        return {"exists": False, "generations": 0, "attempts": 0, "gpu_seconds": 0.0, "harness_version": None}
    wh = Warehouse(warehouse_root)
    done = wh.query("select count(distinct generation) as n from stage_times where run_id = ? and stage = 'select'",
                    [run_id]).to_pylist()[0]["n"]
    a = wh.query("select count(*) as n, coalesce(sum(gpu_seconds), 0) as s from attempts where run_id = ?",
                 [run_id]).to_pylist()[0]
    return {"exists": True, "generations": int(done), "attempts": int(a["n"]), "gpu_seconds": float(a["s"]),
            "harness_version": int(run_rows(warehouse_root, run_id)[0]["harness_version"])}


def next_block(plan: dict[str, Any], progress: dict[str, Any]) -> int | None:
    """The generation count the run's next block goes to, or None when the run is done (its generations or
    a budget spent)."""
    if progress["generations"] >= plan["generations"]:
        return None
    if plan["budget_candidates"] is not None and progress["attempts"] >= plan["budget_candidates"]:
        return None
    if plan["budget_gpu_minutes"] is not None and progress["gpu_seconds"] / 60 >= plan["budget_gpu_minutes"]:
        return None
    return min(progress["generations"] + plan["block"], plan["generations"])


def harness_for_block(arm: str, warehouse_root: str) -> int:
    """The harness version a block runs under: v0 for the frozen arm, the newest approved for the evolving."""
    if arm == "frozen" or not Path(warehouse_root).exists():
        return 0
    return max(harness_versions(warehouse_root))


# ------------------------------------------------------------------ the report

def headline_shapes(wh: Warehouse, run_id: str, timed: bool) -> list[str]:
    """The shapes both the run's kernels and the hand-written ones are scored on."""
    if timed:
        return [r["shape"] for r in wh.query("select shape from run_headlines where run_id = ? order by shape",
                                             [run_id]).to_pylist()]
    rows = wh.query("""
        select distinct p.shape, coalesce(sh.role, 'headline') as role
        from predictions p join attempts a using (attempt_id) join runs_latest r on r.run_id = a.run_id
        left join (select distinct shape_set, problem, shape, role from shapes) sh
               on sh.shape_set = r.shape_set and sh.problem = r.problem and sh.shape = p.shape
        where a.run_id = ? order by p.shape""", [run_id]).to_pylist()
    heads = [r["shape"] for r in rows if r["role"] == "headline"]
    return heads or [r["shape"] for r in rows if r["role"] != "held_out"]


def kernel_scores(wh: Warehouse, run_id: str, shapes: list[str], timed: bool) -> list[dict[str, Any]]:
    """Each scored attempt of the run on ``shapes`` (all of them), in generation order; a kernel that came out wrong
    when the final stage confirmed it (``confirm_failures``) scores nothing."""
    if not shapes:
        return []
    marks = ", ".join("?" * len(shapes))
    if timed:
        sql = f"""select a.attempt_id, a.generation, a.slot, m.shape, m.median_ms as ms
                  from measurements m join attempts a using (attempt_id)
                  where a.run_id = ? and m.kind = 'search' and m.correct and m.shape in ({marks})
                    and a.attempt_id not in (select attempt_id from confirm_failures)"""
    else:
        sql = f"""select a.attempt_id, a.generation, a.slot, p.shape, p.predicted_ms as ms
                  from predictions p join attempts a using (attempt_id)
                  where a.run_id = ? and a.outcome = 'checked' and p.shape in ({marks})
                    and a.attempt_id not in (select attempt_id from confirm_failures)"""
    per: dict[str, dict[str, Any]] = {}
    for r in wh.query(sql, [run_id, *shapes]).to_pylist():
        if r["ms"] is not None and r["ms"] > 0:
            k = per.setdefault(r["attempt_id"], {"generation": r["generation"], "slot": r["slot"], "ms": {}})
            k["ms"][r["shape"]] = r["ms"]
    out = [{"attempt_id": a, "generation": k["generation"], "slot": k["slot"],
            "score_ms": geomean(k["ms"].values())} for a, k in per.items() if len(k["ms"]) == len(shapes)]
    return sorted(out, key=lambda k: (k["generation"], k["slot"] or 0))


def hand_written_best(wh: Warehouse, run_id: str, shapes: list[str],
                      timed: bool) -> tuple[float | None, str | None]:
    """The best hand-written kernel's score on ``shapes`` (each shape scored and correct where checked)."""
    if not shapes:
        return None, None
    col = "median_ms" if timed else "predicted_ms"
    marks = ", ".join("?" * len(shapes))
    rows = wh.query(f"""select name, shape, {col} as ms, correct from baselines
                        where run_id = ? and source = 'hand_written' and shape in ({marks})""",
                    [run_id, *shapes]).to_pylist()
    per: dict[str, dict[str, float]] = {}
    bad: set[str] = set()
    for r in rows:
        if r["ms"] is None or r["ms"] <= 0 or r["correct"] is False or (timed and not r["correct"]):
            bad.add(r["name"])
        else:
            per.setdefault(r["name"], {})[r["shape"]] = r["ms"]
    scores = {n: geomean(v.values()) for n, v in per.items() if n not in bad and len(v) == len(shapes)}
    if not scores:
        return None, None
    name = min(scores, key=scores.get)
    return scores[name], name


def convergence(scores: list[dict[str, Any]], target_ms: float | None) -> dict[str, Any] | None:
    """The first scored attempt (in generation order) within ``CONVERGED_AT`` of the target, or None."""
    if target_ms is None:
        return None
    return next((s for s in scores if s["score_ms"] <= target_ms / CONVERGED_AT), None)


def run_result(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One row of the report: converged or not, what it took, what failing candidates cost, what was approved."""
    root, rid, timed = run["warehouse_root"], run["run_id"], plan["mode"] == "gpu"
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(arm=run["arm"], seed=run["seed"], run_id=rid, converged=False, approved={})
    if not Path(root).exists() or not run_rows(root, rid):
        return {**row, "note": "not run yet"}
    wh = Warehouse(root)
    shapes = headline_shapes(wh, rid, timed)
    scores = kernel_scores(wh, rid, shapes, timed)
    hw_ms, hw_name = hand_written_best(wh, rid, shapes, timed)
    att = wh.query("select generation, outcome, coalesce(gpu_seconds, 0) as gpu_s, harness_version from attempts "
                   "where run_id = ?", [rid]).to_pylist()
    secs = {r["generation"]: r["s"] for r in wh.query(
        "select generation, sum(wall_s) as s from stage_times where run_id = ? and generation >= 0 group by 1",
        [rid]).to_pylist()}
    hit = convergence(scores, hw_ms)
    best = min((s["score_ms"] for s in scores), default=None)
    approved: dict[str, int] = {}
    for r in wh.query("select kind, count(*) as n from proposals_latest where status = 'approved' group by 1"
                      ).to_pylist():
        approved[r["kind"]] = int(r["n"])
    row.update(
        attempts=len(att), generations=len({r["generation"] for r in att}),
        failed_candidates=sum(r["outcome"] in FAILED for r in att),
        gpu_s_failed=round(sum(r["gpu_s"] for r in att if r["outcome"] in GPU_FAILED), 3),
        gpu_s=round(sum(r["gpu_s"] for r in att), 3),
        best_ms=best, hand_written_ms=hw_ms, hand_written=hw_name, basis="measured" if timed else "predicted",
        speed_vs_hand_written=round(hw_ms / best, 4) if hw_ms and best else None,
        harness_versions=sorted({int(r["harness_version"]) for r in att}), approved=approved,
        headline_shapes=shapes)
    if hit is not None:
        g = hit["generation"]
        row.update(converged=True, generations_to_converge=g + 1,
                   seconds_to_converge=round(sum(v for k, v in secs.items() if k <= g), 1),
                   gpu_s_to_converge=round(sum(r["gpu_s"] for r in att if r["generation"] <= g), 3))
    return row


def median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: runs converged, median GPU-seconds to converge, GPU-seconds on failing candidates; the
    evolving arm's saving on those."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        rs = [r for r in rows if r["arm"] == arm and r.get("attempts")]
        out[arm] = {"runs": len(rs), "converged": sum(bool(r["converged"]) for r in rs),
                    "median_gpu_s_to_converge": median([r["gpu_s_to_converge"] for r in rs if r["converged"]]),
                    "gpu_s_failed": round(sum(r["gpu_s_failed"] or 0 for r in rs), 3),
                    "failed_candidates": sum(r["failed_candidates"] or 0 for r in rs)}
    f, e = out["frozen"]["gpu_s_failed"], out["evolving"]["gpu_s_failed"]
    out["evolving_fewer_gpu_s_failed"] = round(1 - e / f, 4) if f > 0 else None
    fc, ec = out["frozen"]["failed_candidates"], out["evolving"]["failed_candidates"]
    out["evolving_fewer_failed_candidates"] = round(1 - ec / fc, 4) if fc > 0 else None
    out["separates"] = separates(rows)
    return out


def separates(rows: list[dict[str, Any]]) -> str | None:
    """Why this experiment cannot tell the arms apart by convergence (None: it can). Every frozen run converging
    within its first two generations means the naive seed's constant moves alone reach the hand-written best on
    these shapes (small shapes, where the hand-written kernels built for large ones lose to launch latency)."""
    frozen = [r for r in rows if r["arm"] == "frozen" and r.get("attempts")]
    if frozen and all(r["converged"] and (r.get("generations_to_converge") or 0) <= 2 for r in frozen):
        return ("every frozen run converged within two generations: on these shapes the seed's retuned constants already "
                "reach the hand-written best, so convergence does not separate the arms; use a shape set where the "
                "hand-written kernels are fast (large shapes, which they were built for) or compare GPU-seconds "
                "on failures alone")
    return None


def cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "none"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "none"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """The report's table in Markdown: one row per arm and seed."""
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    return head + "".join("\n| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in rows)


def record_review(plan: dict[str, Any], review: dict[str, Any]) -> None:
    """Add one harness review to ``experiment.json`` the moment it is decided: a call that a kill or a time
    limit cuts short keeps the reviews it ran, and the report of the call that finishes lists them all."""
    path = Path(plan["out_dir"]) / "experiment.json"
    kept = json.loads(path.read_text()) if path.exists() else {"plan": plan}
    kept["reviews"] = kept.get("reviews", []) + [review]
    path.write_text(json.dumps(kept, indent=1, default=str))


def write_report(plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``frozen-vs-evolving.json`` and ``.md`` under the plan's out dir (the reviews as :func:`record_review`
    kept them, over every call of the experiment); returns the report."""
    policy = {"name": plan["approve"], "harness_review_policy": plan["review_policy"],
              "meaning": POLICY_WORDS[plan["approve"]],
              "corpus_gate": "CPU interpreter and the GPU" if plan.get("gate_gpu") else "CPU interpreter"}
    basis = "measured" if plan["mode"] == "gpu" else "predicted by the cost model"
    out = Path(plan["out_dir"])
    old = json.loads((out / "experiment.json").read_text()) if (out / "experiment.json").exists() else {}
    report = {"experiment": "frozen-vs-evolving", "plan": plan, "policy": policy, "rows": rows,
              "summary": summary(rows), "reviews": old.get("reviews", []),
              "converged_means": f"a kernel at least {CONVERGED_AT}x the speed of the best hand-written kernel "
                                 f"on the run's headline shapes ({basis})"}
    (out / "experiment.json").write_text(json.dumps(report, indent=1, default=str))
    s = report["summary"]
    budget = ", ".join(f"--{k.replace('_', '-')} {plan[k]}" for k in ("budget_candidates", "budget_gpu_minutes")
                       if plan[k] is not None) or "none"
    md = [f"# frozen vs evolving: {plan['problem']} on {plan['shape_set']} ({plan['mode'].upper()} mode)", "",
          f"- approval policy of the evolving arm: `{policy['name']}` ({policy['meaning']}; the corpus gate on the "
          f"{policy['corpus_gate']})",
          f"- per run: cold start, seeds {plan['seeds']}, population {plan['population']}, up to "
          f"{plan['generations']} generations in blocks of {plan['block']}, budget per run: {budget}",
          f"- converged: {report['converged_means']}", "",
          table(rows), "",
          f"frozen: {s['frozen']['converged']}/{s['frozen']['runs']} converged, {s['frozen']['gpu_s_failed']} GPU-s on "
          f"failed candidates ({s['frozen']['failed_candidates']} candidates); evolving: "
          f"{s['evolving']['converged']}/{s['evolving']['runs']} converged, {s['evolving']['gpu_s_failed']} GPU-s "
          f"({s['evolving']['failed_candidates']} candidates)"]
    if s.get("separates"):
        md += ["", f"**Caveat:** {s['separates']}."]
    (out / "frozen-vs-evolving.md").write_text("\n".join(md) + "\n")
    return report
