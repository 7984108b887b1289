"""The transfer experiment's steps: its plan, the learned harness carried into each run's warehouse, the report.

Plain functions, not Prefect tasks, as ``tasks.experiment``'s are: the CLI calls them between the evolve flows
it runs.

Does a harness learned on some problems pay on problems it never saw (those named, else every problem the
registry finds that the source home never ran)? Two arms of cold-start runs of the same
tactic agent with the same seeds and budget, one run per arm, problem and seed, each in a warehouse of its own
(``OUT/<arm>/<problem>-s<seed>/warehouse``: no run sees another's attempts, nor any earlier run of its problem):

- ``frozen``: pinned to harness v0, the built-in one;
- ``learned``: pinned to an approved harness version of a source home (the rules, primitives, macros and
  calibrations a review of that home's runs approved), carried into the run's warehouse with its proposals and
  decisions (``tasks.harness.import_harness_chain``), so the run's attempts record that version and the
  warehouse's ``harness_effects`` says what each change did there.

The source's chain is read once, on the experiment's first call, and kept as ``OUT/learned-harness.json``; a
later call with the same ``OUT`` continues from there. A target problem with runs in the source home from
before the version was approved is refused: the harness may have learned from them.

A run *converged* when a kernel it found is at least ``CONVERGED_AT`` of the speed of a target on the run's
headline shapes, the target being, in this order, the best hand-written kernel of the problem (the best known
kernel), else the fastest of the problem's bench peers times its bench target's speed-up (measured, so on a GPU
only), else the naive seed's own score times a stated speed-up (``seed_target``: the CPU mode of a problem
without hand-written kernels, whose peers the cost model cannot predict). Each row says which it used. On the CPU
a run's scores and its target both come from the cost model its harness ranks with, so a calibration the learned
arm carries moves the two together.

Per run the report gives what converging took (the candidates and GPU-minutes of every generation up to the
converging one), the GPU-seconds and candidates spent on doomed candidates (:func:`is_doomed`), and what each
harness change did in the run's warehouse (``harness_effects``) with those its winner used; per arm it sums
them, a run that never converged counting all it spent, and sets the arms against the goals (:data:`GOALS`) as
measured, whichever way they come out.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cake_core.errors import CakeError
from cake_core.model.base import geomean
from cake_core.problems import get_problem, list_problems, load_shape_set
from tasks.experiment import (CONVERGED_AT, DEFAULT_GENERATIONS, cell, check_budget, convergence, hand_written_best,
                              headline_shapes, kernel_scores, median)
from tasks.harness import chain_to_json, harness_chain, import_harness_chain
from warehouse import Warehouse
from warehouse.queries import run_rows

ARMS = ("frozen", "learned")
DOOMED = ("wrong", "runtime_fault", "timeout")      # reached the check (the GPU, or the interpreter), then failed
SEED_TARGET = 1.5                                   # the stated target where there is no other: 1.5x the seed
# the learned arm's saving each goal asks for (besides converging on at least as many runs as the frozen arm)
GOALS = {"gpu_min_to_converge": 0.30, "doomed_gpu_s": 0.50}
RUN_COLUMNS = ("arm", "problem", "seed", "converged", "reference", "candidates_to_converge", "gpu_min_to_converge",
               "doomed_gpu_s", "doomed_candidates", "attempts", "gpu_min", "best_ms", "target_ms", "harness_versions",
               "winner_used")
ARM_COLUMNS = ("arm", "problem", "runs", "converged", "candidates_to_converge", "gpu_min_to_converge",
               "doomed_gpu_s", "doomed_candidates", "winners_used", "rules_stopped")
CHAIN_FILE = "learned-harness.json"     # the learned arm's harness chain, kept under the experiment's out dir
FIXED = ("problems", "shape_sets", "population", "block", "mode", "seed_target", "learned_from", "learned_version")


def run_id_of(problem: str, arm: str, seed: int) -> str:
    return f"{problem}-{arm}-s{seed}"


def source_warehouse(path: str | Path) -> Path:
    """The warehouse of a Cake home (``HOME/warehouse``), or ``path`` itself when it is a warehouse folder."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise CakeError(f"--learned-from {p}: no such folder; pass the Cake home (or its warehouse) whose runs the "
                        "harness was learned from")
    for root in (p / "warehouse", p):
        if (root / "SCHEMA_VERSION").is_file():
            return root
    raise CakeError(f"--learned-from {p} is neither a Cake home with a warehouse (it has no warehouse/) nor a "
                    "warehouse; pass the home whose runs the harness was learned from")


def source_problems(warehouse_root: str | Path, chain: dict[str, Any]) -> dict[str, int]:
    """The problems of the source's runs that started before the chain's newest version was approved (what its
    review could have read), with their run counts."""
    approved = max(v["created_at"] for v in chain["harness_versions"])
    rows = Warehouse(warehouse_root).query(
        "select problem, count(*) as n from runs_latest where started_at <= ? group by 1 order by 1",
        [approved]).to_pylist()
    return {r["problem"]: int(r["n"]) for r in rows}


def transfer_plan(problems: list[str] | None, shape_sets: dict[str, str], seeds: list[int], out_dir: str,
                  population: int, block: int, generations: int | None, budget_candidates: int | None,
                  budget_gpu_minutes: float | None, timed: bool, learned_from_path: str | None = None,
                  learned_version: int | None = None, seed_target: float = SEED_TARGET) -> dict[str, Any]:
    """The experiment's runs and limits, and the learned harness they carry, checked before anything runs (a
    CakeError says what to change). The first call reads the source home's harness chain and keeps it under
    ``out_dir``; a later call with the same settings continues with the kept chain (``learned_from_path`` may
    then be left out). ``problems`` None: every problem Cake finds that the source's runs never touched (on a
    later call, the ones the first took)."""
    out = Path(out_dir)
    recorded = out / "transfer.json"
    kept = json.loads(recorded.read_text()) if recorded.exists() else {}
    was = kept.get("plan")
    chain, fresh, source, seen = _learned_harness(out, was, learned_from_path, learned_version)
    if problems is None:
        problems = was["problems"] if was else [p.name for p in list_problems() if p.name not in seen]
        if not problems:
            raise CakeError(f"{source} has runs of every problem Cake finds ({', '.join(sorted(seen))}): none is new "
                            "to its harness; name the problems with --problems, or pass another home")
    if not problems:
        raise CakeError("--problems names no problem; give one or more, comma-separated (default: every problem "
                        "the source home never ran)")
    twice = sorted({p for p in problems if problems.count(p) > 1})
    if twice:
        raise CakeError(f"--problems names {', '.join(twice)} twice; name each problem once")
    unknown = sorted(set(shape_sets) - set(problems))
    if unknown:
        raise CakeError(f"--shapes names {', '.join(unknown)}, which --problems does not; give PROBLEM=SET for a "
                        "problem of the experiment")
    sets = {}
    for name in problems:
        prob = get_problem(name)
        sets[name] = shape_sets.get(name) or prob.shape_sets[0]
        load_shape_set(prob, sets[name])
    check_budget(seeds, block, population, generations, budget_candidates, budget_gpu_minutes, timed)
    if not seed_target > 1:
        raise CakeError(f"--seed-target must be above 1 (a speed-up over the naive seed), got {seed_target}")
    if generations is None:
        generations = (math.ceil(budget_candidates / population) if budget_candidates is not None
                       else DEFAULT_GENERATIONS)
    overlap = [p for p in problems if p in seen]
    if fresh and overlap:
        raise CakeError(f"{source} has runs of {', '.join(f'{p} ({seen[p]})' for p in overlap)} from before harness "
                        f"v{chain['version']} was approved: its review may have learned from them; transfer is to "
                        "problems the harness never saw, so drop them from --problems or pass another home")
    version = learned_version if learned_version is not None else chain["version"]
    plan = {"experiment": "transfer", "problems": list(problems), "shape_sets": sets, "seeds": list(seeds),
            "out_dir": str(out), "population": population, "block": block, "generations": generations,
            "budget_candidates": budget_candidates, "budget_gpu_minutes": budget_gpu_minutes,
            "mode": "gpu" if timed else "cpu", "seed_target": seed_target, "learned_from": source,
            "learned_version": version, "learned_from_problems": seen, "learned_changes": changes_of(chain),
            "cache_dir": str(out / "cache"), "runs": []}
    if was is not None:
        diff = [k for k in FIXED if was.get(k) != plan[k]]
        if diff:
            raise CakeError(f"{out} holds a transfer experiment with other settings ("
                            + ", ".join(f"{k} {was.get(k)!r}, not {plan[k]!r}" for k in diff)
                            + "); pass another --out, or the same settings to continue it")
    for problem in problems:            # pair by pair: a cut-short experiment has compared what pairs it could
        for seed in seeds:
            for arm in ARMS:
                plan["runs"].append({"arm": arm, "problem": problem, "shape_set": sets[problem], "seed": seed,
                                     "run_id": run_id_of(problem, arm, seed),
                                     "harness_version": version if arm == "learned" else 0,
                                     "warehouse_root": str(out / arm / f"{problem}-s{seed}" / "warehouse")})
    out.mkdir(parents=True, exist_ok=True)
    if fresh:                   # first, so that a plan on record always has its chain beside it
        (out / CHAIN_FILE).write_text(chain_to_json(chain) + "\n")
    recorded.write_text(json.dumps({**kept, "plan": plan}, indent=1, default=str))
    return plan


def _learned_harness(out: Path, was: dict[str, Any] | None, learned_from_path: str | None,
                     learned_version: int | None) -> tuple[dict[str, Any], bool, str, dict[str, int]]:
    """The chain the learned arm carries, whether it is read afresh (not kept under ``out`` yet), the source
    warehouse, and the problems of the source's runs it may have learned from. A kept chain is used as it is: a
    later call needs only ``out``."""
    source = str(source_warehouse(learned_from_path)) if learned_from_path is not None else None
    if was is not None and (out / CHAIN_FILE).exists():
        return (json.loads((out / CHAIN_FILE).read_text()), False, source or was["learned_from"],
                was["learned_from_problems"])
    if source is None:
        raise CakeError("give --learned-from HOME: the Cake home (or warehouse) whose approved harness the learned "
                        "arm carries")
    chain = harness_chain(source, learned_version)
    return chain, True, source, source_problems(source, chain)


def changes_of(chain: dict[str, Any]) -> list[dict[str, Any]]:
    """The approved changes of a harness chain, one line each: version, kind, title."""
    titles = {p["proposal_id"]: p for p in chain["proposals"]}
    return [{"version": int(v["version"]), "kind": titles.get(v["proposal_id"], {}).get("kind"),
             "title": titles.get(v["proposal_id"], {}).get("title"), "proposal_id": v["proposal_id"]}
            for v in chain["harness_versions"]]


def prepare_run(plan: dict[str, Any], run: dict[str, Any]) -> int:
    """Make the run's warehouse ready for its next block: the learned arm's gets the kept harness chain (again a
    no-op once it is there). Returns the harness version the run is pinned to."""
    if run["arm"] == "learned":
        chain = json.loads((Path(plan["out_dir"]) / CHAIN_FILE).read_text())
        import_harness_chain(run["warehouse_root"], chain)
    return run["harness_version"]


# ------------------------------------------------------------------ one run's figures

def reference(hand_written: tuple[float | None, str | None], peer: tuple[float | None, str | None],
              peer_speedup: float, seed_ms: float | None, seed_target: float) -> dict[str, Any] | None:
    """The target a run converges to: the best hand-written kernel, else the fastest peer sped up by the bench
    target, else the naive seed sped up by ``seed_target`` (None: nothing to aim at)."""
    if hand_written[0]:
        return {"kind": "hand_written", "name": hand_written[1], "ms": hand_written[0], "factor": 1.0,
                "target_ms": hand_written[0]}
    if peer[0]:
        return {"kind": "peer", "name": peer[1], "ms": peer[0], "factor": peer_speedup,
                "target_ms": peer[0] / peer_speedup}
    if seed_ms:
        return {"kind": "seed", "name": "naive seed", "ms": seed_ms, "factor": seed_target,
                "target_ms": seed_ms / seed_target}
    return None


def reference_words(ref: dict[str, Any] | None) -> str:
    if ref is None:
        return "none (no hand-written kernel, peer or seed scored)"
    if ref["kind"] == "hand_written":
        return f"hand-written {ref['name']}"
    return f"{'peer ' if ref['kind'] == 'peer' else ''}{ref['name']} x{ref['factor']:g}"


def is_doomed(attempt: dict[str, Any], confirm_failed: set[str]) -> bool:
    """Whether the attempt reached the check (the GPU, or the interpreter) and did not come out a correct
    kernel: wrong, faulting or hung there, found wrong when the final stage confirmed it, or holding GPU time
    without a measurement."""
    return (attempt["outcome"] in DOOMED or attempt["attempt_id"] in confirm_failed
            or (attempt["gpu_s"] > 0 and attempt["outcome"] != "measured"))


def run_figures(attempts: list[dict[str, Any]], confirm_failed: set[str], scores: list[dict[str, Any]],
                target_ms: float | None) -> dict[str, Any]:
    """Converged or not, and what it took, from a run's attempts (``attempt_id``, ``generation``, ``outcome``,
    ``gpu_s``) and scored kernels (:func:`tasks.experiment.kernel_scores`). A run converges in the generation of
    its first kernel within ``CONVERGED_AT`` of ``target_ms``; the candidates and GPU time to converge are those
    of every generation up to and including it (a generation's candidates run as one batch)."""
    doomed = [a for a in attempts if is_doomed(a, confirm_failed)]
    out = {"attempts": len(attempts), "gpu_min": round(sum(a["gpu_s"] for a in attempts) / 60, 4),
           "doomed_candidates": len(doomed), "doomed_gpu_s": round(sum(a["gpu_s"] for a in doomed), 3),
           "converged": False, "generation_converged": None, "candidates_to_converge": None,
           "gpu_min_to_converge": None,
           "best_ms": min((s["score_ms"] for s in scores), default=None)}
    hit = convergence(scores, target_ms)
    if hit is not None:
        upto = [a for a in attempts if a["generation"] <= hit["generation"]]
        out.update(converged=True, generation_converged=hit["generation"], candidates_to_converge=len(upto),
                   gpu_min_to_converge=round(sum(a["gpu_s"] for a in upto) / 60, 4))
    return out


def _peer_best(wh: Warehouse, run_id: str, shapes: list[str],
               peers: tuple[str, ...]) -> tuple[float | None, str | None]:
    """The fastest measured peer per headline shape (of ``peers`` when given), as a geomean over ``shapes``."""
    if not shapes:
        return None, None
    marks = ", ".join("?" * len(shapes))
    rows = wh.query(f"""select name, shape, median_ms from baselines where run_id = ? and source = 'peer'
                        and shape in ({marks}) and median_ms > 0 and coalesce(correct, true)""",
                    [run_id, *shapes]).to_pylist()
    best: dict[str, tuple[float, str]] = {}
    for r in rows:
        if peers and r["name"] not in peers:
            continue
        if r["shape"] not in best or r["median_ms"] < best[r["shape"]][0]:
            best[r["shape"]] = (r["median_ms"], r["name"])
    if len(best) != len(shapes):
        return None, None
    return geomean(ms for ms, _ in best.values()), ", ".join(sorted({n for _, n in best.values()}))


def _seed_ms(wh: Warehouse, run_id: str, scores: list[dict[str, Any]]) -> float | None:
    seed = wh.query("select attempt_id from attempts where run_id = ? and tactic = 'seed' order by generation, slot "
                    "limit 1", [run_id]).to_pylist()
    return next((s["score_ms"] for s in scores if seed and s["attempt_id"] == seed[0]["attempt_id"]), None)


def _effects(wh: Warehouse, run_id: str) -> tuple[list[dict[str, Any]], list[str]]:
    """What each harness change of the run's warehouse did (``harness_effects``) and those the run's winner
    used: a primitive it calls, a macro in its lineage, a calibration whose model ranked it."""
    rows = wh.query("select version, kind, coalesce(name, kind || ' v' || version) as name, stopped, gpu_s_saved, "
                    "used, winners, ranked from harness_effects order by version").to_pylist()
    win = wh.query("select b.attempt_id, a.harness_version, a.predicted_ms from run_best b join attempts a "
                   "using (attempt_id) where b.run_id = ?", [run_id]).to_pylist()
    used = []
    for e in rows:
        if (e["winners"] or 0) > 0 or (e["kind"] == "calibration" and win and win[0]["predicted_ms"] is not None
                                       and win[0]["harness_version"] >= e["version"]):
            used.append(e["name"])
    return rows, used


def run_result(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One row of the report: converged or not against which target, what it took, what doomed candidates cost,
    which harness changes acted and which the winner used."""
    root, rid, timed = run["warehouse_root"], run["run_id"], plan["mode"] == "gpu"
    row: dict[str, Any] = {c: None for c in RUN_COLUMNS}
    row.update(arm=run["arm"], problem=run["problem"], seed=run["seed"], run_id=rid, converged=False,
               winner_used=[], harness_versions=[])
    if not Path(root).exists() or not run_rows(root, rid):
        return {**row, "note": "not run yet"}
    wh = Warehouse(root)
    prob = get_problem(run["problem"])
    shapes = headline_shapes(wh, rid, timed)
    scores = kernel_scores(wh, rid, shapes, timed)
    bench = prob.bench
    peer = _peer_best(wh, rid, shapes, bench.peers if bench else ()) if timed else (None, None)
    ref = reference(hand_written_best(wh, rid, shapes, timed), peer, bench.speedup if bench else 1.0,
                    _seed_ms(wh, rid, scores), plan["seed_target"])
    att = wh.query("select attempt_id, generation, outcome, coalesce(gpu_seconds, 0) as gpu_s, harness_version "
                   "from attempts where run_id = ?", [rid]).to_pylist()
    bad = {r["attempt_id"] for r in wh.query("select distinct attempt_id from confirm_failures where run_id = ?",
                                             [rid]).to_pylist()}
    effects, used = _effects(wh, rid)
    row.update(run_figures(att, bad, scores, ref["target_ms"] if ref else None))
    row.update(reference=reference_words(ref), reference_detail=ref, target_ms=ref["target_ms"] if ref else None,
               basis="measured" if timed else "predicted", headline_shapes=shapes,
               harness_versions=sorted({int(a["harness_version"]) for a in att}), harness_effects=effects,
               winner_used=used)
    return row


# ------------------------------------------------------------------ the summary

def arm_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs, converged runs, and the totals over them: candidates and GPU-minutes to converge (a run that did
    not converge counts everything it spent: a lower bound on what converging would have cost it), GPU-seconds
    and candidates on doomed candidates, the harness changes the winners used (runs whose winner used each)
    and the candidates the rules stopped."""
    done = [r for r in rows if r.get("attempts")]
    winners: dict[str, int] = {}
    stopped = 0
    for r in done:
        for name in r.get("winner_used") or []:
            winners[name] = winners.get(name, 0) + 1
        stopped += sum(e["stopped"] or 0 for e in r.get("harness_effects") or [] if e["kind"] == "rule")
    return {"runs": len(done), "converged": sum(bool(r["converged"]) for r in done),
            "not_converged": sum(not r["converged"] for r in done),
            "candidates_to_converge": sum(r["candidates_to_converge"] if r["converged"] else r["attempts"]
                                          for r in done),
            "gpu_min_to_converge": round(sum(r["gpu_min_to_converge"] if r["converged"] else r["gpu_min"]
                                             for r in done), 4),
            "median_gpu_min_to_converge": median([r["gpu_min_to_converge"] for r in done if r["converged"]]),
            "doomed_gpu_s": round(sum(r["doomed_gpu_s"] for r in done), 3),
            "doomed_candidates": sum(r["doomed_candidates"] for r in done),
            "winners_used": dict(sorted(winners.items())), "rules_stopped": stopped}


def fewer(learned: float, frozen: float) -> float | None:
    """How much less the learned arm spent, as a fraction of the frozen arm's (negative: more); None when the
    frozen arm spent nothing to compare with."""
    return round(1 - learned / frozen, 4) if frozen > 0 else None


def goals(arms: dict[str, dict[str, Any]], timed: bool) -> list[dict[str, Any]]:
    """The arms against the experiment's goals, as measured: each with both arms' figures, the learned arm's
    saving, whether the goal was met (None: not measurable here) and its line."""
    f, l = arms["frozen"], arms["learned"]
    out = [{"goal": "converged", "frozen": f["converged"], "learned": l["converged"], "runs": l["runs"],
            "met": l["converged"] >= f["converged"] if f["runs"] and l["runs"] else None}]
    out[0]["line"] = (f"converged: learned {l['converged']}/{l['runs']} runs, frozen {f['converged']}/{f['runs']}; "
                      f"goal: at least as many: {_met(out[0]['met'])}")
    for key, unit, what in (("gpu_min_to_converge", "GPU-min", "GPU-minutes to converge (a run that did not "
                                                                 "converge counts all it spent)"),
                            ("doomed_gpu_s", "GPU-s", "GPU-seconds on doomed candidates")):
        saving = fewer(l[key], f[key]) if timed else None
        g = {"goal": key, "frozen": f[key], "learned": l[key], "fewer": saving, "target": GOALS[key],
             "met": None if saving is None else saving >= GOALS[key]}
        if not timed:
            g["line"] = f"{what}: not measurable in CPU mode (no GPU time is spent)"
        else:
            g["line"] = (f"{what}: learned {l[key]:g} {unit}, frozen {f[key]:g} {unit}, {_fewer(saving)}; goal: at "
                         f"least {GOALS[key]:.0%} fewer: {_met(g['met'])}")
        out.append(g)
    for key, what in (("candidates_to_converge", "candidates to converge (a run that did not converge counts all "
                                                 "its candidates)"),
                      ("doomed_candidates", "doomed candidates")):
        saving = fewer(l[key], f[key])
        out.append({"goal": key, "frozen": f[key], "learned": l[key], "fewer": saving, "target": None, "met": None,
                    "line": f"{what}: learned {l[key]}, frozen {f[key]}, {_fewer(saving)} (no goal; the count "
                            "behind the GPU figures)"})
    return out


def _fewer(saving: float | None) -> str:
    if saving is None:
        return "no saving to measure (the frozen arm spent none)"
    return f"{abs(saving):.0%} {'fewer' if saving >= 0 else 'more'}"


def _met(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "not met")


def summary(rows: list[dict[str, Any]], timed: bool) -> dict[str, Any]:
    """Per arm, per arm and problem, and the goals."""
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    arms = {arm: arm_figures([r for r in rows if r["arm"] == arm]) for arm in ARMS}
    per_problem = [{"arm": arm, "problem": p, **arm_figures([r for r in rows if r["arm"] == arm and r["problem"] == p])}
                   for p in problems for arm in ARMS]
    return {"arms": arms, "per_problem": per_problem, "goals": goals(arms, timed)}


# ------------------------------------------------------------------ the report

def table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """``rows`` as a Markdown table of ``columns``."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
    return head + "".join("\n| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows)


def arm_table(per_problem: list[dict[str, Any]]) -> str:
    """The per-arm-and-problem figures as a Markdown table, each change the winners used with the runs it won in."""
    return table([{**a, "winners_used": ", ".join(f"{k} in {n}/{a['runs']}" for k, n in a["winners_used"].items())}
                  for a in per_problem], ARM_COLUMNS)


def write_report(plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``transfer.json`` and ``transfer.md`` under the plan's out dir; returns the report."""
    timed = plan["mode"] == "gpu"
    out = Path(plan["out_dir"])
    s = summary(rows, timed)
    basis = "measured" if timed else "predicted by the cost model"
    report = {"experiment": "transfer", "plan": plan, "rows": rows, "summary": s,
              "converged_means": f"a kernel at least {CONVERGED_AT}x the speed of the run's target on its headline "
                                 f"shapes ({basis}); the target: the best hand-written kernel where the problem has "
                                 "one, else its fastest bench peer times the bench target's speed-up (GPU only), "
                                 f"else the naive seed times {plan['seed_target']:g} (stated); each row names its own"}
    (out / "transfer.json").write_text(json.dumps(report, indent=1, default=str))
    budget = ", ".join(f"--{k.replace('_', '-')} {plan[k]}" for k in ("budget_candidates", "budget_gpu_minutes")
                       if plan[k] is not None) or "none"
    seen = ", ".join(f"{p} ({n} run{'s' * (n != 1)})" for p, n in plan["learned_from_problems"].items()) or "none"
    md = [f"# transfer: {', '.join(plan['problems'])} ({plan['mode'].upper()} mode)", "",
          f"- learned arm: harness v{plan['learned_version']} of `{plan['learned_from']}`, learned from runs of "
          f"{seen}; frozen arm: harness v0",
          f"- per run: cold start, shape sets {', '.join(f'{p} {s}' for p, s in plan['shape_sets'].items())}, seeds "
          f"{plan['seeds']}, population {plan['population']}, up to {plan['generations']} generations in blocks of "
          f"{plan['block']}, budget per run: {budget}; each run in a warehouse of its own",
          f"- converged: {report['converged_means']}", "", "## The learned harness", "",
          table(plan["learned_changes"], ("version", "kind", "title", "proposal_id")), "",
          "## Per run", "", table(rows, RUN_COLUMNS), "",
          "## Per arm and problem", "",
          "Over the seeds; a run that did not converge counts everything it spent to converge; winners_used: the "
          "harness changes the runs' winners used, in how many runs.", "", arm_table(s["per_problem"]), "",
          "## Against the goals", ""]
    md += [f"- {g['line']}" for g in s["goals"]]
    (out / "transfer.md").write_text("\n".join(md) + "\n")
    return report
