"""What the cost filter saves, and what it costs: the same evolution with the filter and without it.

Two runs of `cake evolve` as a user runs them, cold, with the same problem, shapes, seed, population and
candidate budget; one passes the cost filter (`--keep N` when given, else its default), the other times
every candidate that compiled (`--no-filter`). Each run has a Cake home of its own under ``--home`` (so
neither learns from the other's warehouse); they share one cubin cache, which changes no result, only how
long nvcc takes. CuPy's kernel cache is each run's own (``CUPY_CACHE_DIR`` under its home): the kernels that
draw inputs and references are compiled on first use, inside the first candidates' GPU time, so with one
cache the run that goes first holds that cost alone (15-18 s of the filtered runs' GPU-seconds in
bench/results/filter-pair-h200-2026-12-02e-explore-s{0,1}.md) and the GPU-seconds ratio leans to the second.
On the H200, from the repository root (see bench/gpu.sh):

    STATE=fp bash bench/gpu.sh filter_pair --problem tinygemm --shapes tinygemm_decode --population 24 \\
        --generations 6 --keep 4

``--cost-model FILE`` has both runs rank with that model file (`cake model fit`; a file the run cannot use
falls back to the analytic model, and the run's log says so) instead of the harness's analytic model.
A run cut by ``--timeout`` (SIGINT: it stops between stages, keeping what it recorded) is resumed from its
warehouse by the next call with the same ``--home``. Per run, read back from its warehouse: attempts, GPU
timings (timed candidates and (candidate, shape) medians of the search), the GPU-seconds the attempts held,
the best kernel's score (geometric mean over the headline shapes, measured) and, for the filtered run, the
filter's live recall (view ``cost_filter_recall``). Printed last, the two figures the pair is for:
how many times fewer GPU timings the filtered run made, and its best against the unfiltered run's best.
Full results: ``--out``/filter_pair.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("filter", "no-filter")
TARGET_CUT, TARGET_BEST = 3.0, 1.05          # issue 18: timings cut >= 3x, final best within 5%


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _warehouse(home: Path):
    sys.path.insert(0, str(ROOT))
    from warehouse import Warehouse
    return Warehouse(home / "warehouse")


def _recorded_run(home: Path) -> dict | None:
    if not (home / "warehouse").exists():
        return None
    rows = _warehouse(home).query("select run_id, status from runs_latest").to_pylist()
    return rows[0] if rows else None


def run_arm(arm: str, args, out: Path, deadline: float) -> dict:
    home = Path(args.home) / arm
    home.mkdir(parents=True, exist_ok=True)
    cache = Path(args.home) / "cache"
    cache.mkdir(exist_ok=True)
    if not (home / "cache").exists():
        (home / "cache").symlink_to(cache.resolve(), target_is_directory=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}, "CAKE_HOME": str(home),
           "CAKE_GPU": "off" if args.cpu else "require", "PYTHONUNBUFFERED": "1",
           "PREFECT_HOME": str(home / "prefect"), "CAKE_PREFECT_PORT": str(_free_port()),
           "CUPY_CACHE_DIR": str(home / "cupy-cache")}
    recorded = _recorded_run(home)
    if recorded and recorded["status"] == "completed":
        return {"arm": arm, "run_id": recorded["run_id"], "command": "(completed by an earlier call)", "exit": 0}
    if recorded:
        cmd = ["evolve", args.problem, "--resume", recorded["run_id"]]
    else:
        cmd = ["evolve", args.problem, "--shapes", args.shapes, "--cold", "--generations", str(args.generations),
               "--population", str(args.population), "--seed", str(args.seed),
               "--budget-candidates", str(args.budget_candidates or args.generations * args.population)]
        cmd += ["--no-filter"] if arm == "no-filter" else (["--keep", str(args.keep)] if args.keep else [])
        if args.cost_model:         # both rank with it: the unfiltered run records its predictions too
            cmd += ["--cost-model", str(Path(args.cost_model).resolve())]
        if args.cpu:
            cmd += ["--check-shapes", args.check_shapes]
    t0 = time.monotonic()
    log = open(out / f"{arm}.log", "a")
    proc = subprocess.Popen([sys.executable, "-c", "from cake_cli.main import main; main()", *cmd], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)          # cake stops between stages and records the run as cancelled
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
    return {"arm": arm, "command": "cake " + " ".join(cmd), "exit": proc.returncode,
            "command_wall_s": round(time.monotonic() - t0, 1)}


def read_arm(arm: str, args) -> dict:
    home = Path(args.home) / arm
    recorded = _recorded_run(home)
    if recorded is None:
        return {"arm": arm, "error": "no run recorded"}
    wh, rid = _warehouse(home), recorded["run_id"]
    (run,) = wh.query("select run_id, status, stop_reason, filter_keep, cost_filter, population, seed "
                      "from runs_latest").to_pylist()
    q = lambda sql: wh.query(sql, [rid]).to_pylist()[0]      # noqa: E731
    att = q("select count(*) as attempts, coalesce(sum(gpu_seconds), 0) as gpu_s, "
            "count(*) filter (where outcome = 'filtered') as filtered, "
            "coalesce(max(generation), -1) + 1 as generations from attempts where run_id = ?")
    timed = q("select count(distinct attempt_id) as candidates, count(*) as medians from measurements "
              "where run_id = ? and kind = 'search'")
    best = wh.query("select attempt_id, score_ms, basis, tactic, generation from run_best where run_id = ?",
                    [rid]).to_pylist()
    recall = wh.query("select count(*) as cells, count(*) filter (where missed_best) as missed, "
                      "sum(sampled) as sampled from cost_filter_recall where run_id = ?", [rid]).to_pylist()
    outcomes = {r["outcome"]: r["n"] for r in wh.query(
        "select outcome, count(*) as n from attempts where run_id = ? group by 1 order by 1", [rid]).to_pylist()}
    return {"arm": arm, **run, **att, "timed_candidates": timed["candidates"], "timed_medians": timed["medians"],
            "outcomes": outcomes, "best": best[0] if best else None, "recall": recall[0] if recall else None}


def compare(f: dict, n: dict) -> dict:
    def ratio(a, b):
        return round(a / b, 3) if a and b else None
    fb, nb = (f.get("best") or {}).get("score_ms"), (n.get("best") or {}).get("score_ms")
    out = {"timed_candidates_cut": ratio(n.get("timed_candidates"), f.get("timed_candidates")),
           "timed_medians_cut": ratio(n.get("timed_medians"), f.get("timed_medians")),
           "gpu_seconds_cut": ratio(n.get("gpu_s"), f.get("gpu_s")),
           "best_filter_over_no_filter": ratio(fb, nb)}
    complete = f.get("status") == n.get("status") == "completed"
    out["complete"] = complete
    out["cut_met"] = bool(complete and out["timed_medians_cut"] and out["timed_medians_cut"] >= TARGET_CUT)
    out["best_met"] = bool(complete and out["best_filter_over_no_filter"]
                           and out["best_filter_over_no_filter"] <= TARGET_BEST)
    return out


def recall_text(arm: dict) -> str:
    """The filtered run's live recall: (generation, shape) cells graded, and those where a sampled candidate
    beat every survivor; a run without the filter has none."""
    r = arm.get("recall") or {}
    return f"{r.get('cells')} ({r.get('missed')})" if arm.get("arm") == "filter" else "—"


def write_report(result: dict, out: Path) -> str:
    lines = [f"# Filter pair: {result['problem']} on {result['shapes']}, seed {result['seed']}, "
             f"{result['generations']} x {result['population']}, keep {result['keep'] or 'default (half)'}, "
             f"model {result.get('cost_model') or 'analytic (the harness)'}",
             "", f"{result['when']} on {result['host']} ({result['gpu'] or 'no GPU: checked, not timed'})", "",
             "| arm | status | attempts | filtered | timed candidates | timed medians | GPU-s held | best ms | "
             "basis | recall cells (missed) |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for a in result["arms"]:
        if "error" in a:
            lines.append(f"| {a['arm']} | {a['error']} |  |  |  |  |  |  |  |  |")
            continue
        b, r = a.get("best") or {}, a.get("recall") or {}
        lines.append(f"| {a['arm']} | {a['status']} | {a['attempts']} | {a['filtered']} | {a['timed_candidates']} | "
                     f"{a['timed_medians']} | {a['gpu_s']:.2f} | "
                     f"{b.get('score_ms') and round(b['score_ms'], 5)} | {b.get('basis')} | "
                     f"{recall_text(a)} |")
    c = result["compare"]
    def x(v):
        return "—" if v is None else f"{v}x"          # none: nothing was timed (a CPU run), or a run is missing
    lines += ["", f"- GPU timings cut (medians, no-filter / filter): **{x(c['timed_medians_cut'])}** "
                  f"(candidates {x(c['timed_candidates_cut'])}, GPU-seconds {x(c['gpu_seconds_cut'])}); target "
                  f">= {TARGET_CUT}x: {'met' if c['cut_met'] else 'not met'}",
              f"- best, filter / no-filter: **{c['best_filter_over_no_filter']}** (target <= {TARGET_BEST}: "
              f"{'met' if c['best_met'] else 'not met'})"]
    if not c["complete"]:
        lines.append("- the pair is not complete (a run was cut): resume with the same --home")
    text = "\n".join(lines) + "\n"
    (out / "filter_pair.md").write_text(text)
    (out / "filter_pair.json").write_text(json.dumps(result, indent=1, default=str))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problem", required=True)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--generations", type=int, default=6)
    ap.add_argument("--budget-candidates", type=int, default=None, help="default: generations x population")
    ap.add_argument("--keep", type=int, default=None, help="the filtered run's --keep (default: its own default)")
    ap.add_argument("--cost-model", default=None, help="a model file (cake model fit) both runs rank with "
                                                       "(default: the harness's analytic model)")
    ap.add_argument("--home", default="/tmp/cake-filter-pair", help="a Cake home per arm under it")
    ap.add_argument("--out", default="out")
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds for both runs in all (then SIGINT)")
    ap.add_argument("--cpu", action="store_true", help="CAKE_GPU=off: checked on --check-shapes, not timed")
    ap.add_argument("--check-shapes", default=None)
    args = ap.parse_args()
    if args.cpu and not args.check_shapes:
        ap.error("--cpu needs --check-shapes (a shape set small enough for the interpreter)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.timeout
    commands = [run_arm(arm, args, out, deadline) for arm in ARMS]
    arms = [read_arm(arm, args) for arm in ARMS]
    gpu = None
    if not args.cpu:
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            gpu = None
    result = {"problem": args.problem, "shapes": args.shapes, "seed": args.seed, "population": args.population,
              "generations": args.generations, "keep": args.keep, "cost_model": args.cost_model, "host": socket.gethostname(), "gpu": gpu,
              "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commands": commands,
              "arms": arms, "compare": compare(*arms)}
    print(write_report(result, out))
    return 0 if all(c["exit"] == 0 for c in commands) else 1


if __name__ == "__main__":
    sys.exit(main())
