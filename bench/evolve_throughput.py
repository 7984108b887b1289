"""Evolution throughput end to end: `cake evolve` as a user runs it (Prefect flow, Ray workers, CuPy, warehouse),
then candidates per GPU-minute and per wall-minute and the time of each stage, read back from the warehouse.

On the H200, from the repository root, with the bundle of what its image lacks (see bench/gpu_slice.py):

    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site \\
      && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH \\
      && python3 bench/evolve_throughput.py --out $OUT

runs, each cold (the naive seed alone) with CAKE_GPU=require:

    cake evolve kmeans_assign --shapes kmeans_assign_large --cold --generations 4 --population 16
    cake evolve gemm_bf16 --shapes gemm_aligned --cold --generations 4 --population 16

(gemm_aligned holds the 4096^3 and 8192^3 GEMM shapes; their rows are printed apart). ``--gpus 1,2,4`` runs
each of them once per count of GPU runners (``CAKE_GPU_COUNT``; default: one per GPU of the machine).
Without a GPU, ``--cpu`` runs the same commands in a reduced mode: CAKE_GPU=off, each candidate checked on
the interpreter on the problem's small shape set (``--check-shapes``) and scored by the cost model on the
large shapes, so every stage but ``time`` runs as on the GPU machine.

Per run: candidates (attempts recorded), the GPU time the attempts held (sum of gpu_seconds) and the GPU
time reserved (the time stage's and the final stage's wall time x GPUs), the run's wall time (first to last
row) and the command's (services started included); per stage (generate, verify, lower, compile,
cost_filter, check or time, select, final), wall seconds summed over generations and worker seconds. The
best kernel is shown beside the hand-written best and the peers measured in the same run. Full results go
to ``--out``/evolve_throughput.json (with each command's log); a short table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = (("kmeans_assign", "kmeans_assign_large", "kmeans_assign_small"),
        ("gemm_bf16", "gemm_aligned", "gemm_small"))
BIG_GEMM = ("M=4096,N=4096,K=4096", "M=8192,N=8192,K=8192")
STAGES = ("generate", "verify", "lower", "compile", "cost_filter", "check", "time", "select", "final")
TARGET_PER_GPU_MIN, TARGET_PER_WALL_MIN = 60.0, 30.0     # issue 16: on the H200, end to end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(problem: str, shapes: str, check: str, args, out: Path, gpus_asked: int | None) -> dict:
    tag = f"{problem}-{shapes}" + (f"-{gpus_asked}gpu" if gpus_asked else "")
    home = Path(args.home) / tag
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}, "CAKE_HOME": str(home),
           "CAKE_GPU": "off" if args.cpu else "require", "PYTHONUNBUFFERED": "1",
           "PREFECT_HOME": str(home / "prefect"), "CAKE_PREFECT_PORT": str(_free_port())}
    if gpus_asked:
        env["CAKE_GPU_COUNT"] = str(gpus_asked)      # at most this many GPU runners (default: every GPU)
    cmd = ["evolve", problem, "--shapes", shapes, "--cold", "--generations", str(args.generations),
           "--population", str(args.population), "--seed", str(args.seed)]
    if args.cpu:
        cmd += ["--check-shapes", check]
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", "from cake_cli.main import main; main()", *cmd], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")   # noqa: E731
        (out / f"{tag}.log").write_text(text(e.stdout) + "\n--- stderr ---\n" + text(e.stderr))
        return {"command": "cake " + " ".join(cmd), "exit": 124, "command_wall_s": round(time.monotonic() - t0, 1),
                "gpus_asked": gpus_asked, "error": f"did not finish within --timeout {args.timeout:.0f} s"}
    wall = time.monotonic() - t0
    (out / f"{tag}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    row = {"command": "cake " + " ".join(cmd), "exit": proc.returncode, "command_wall_s": round(wall, 1),
           "gpus_asked": gpus_asked}
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return row
    sys.path.insert(0, str(ROOT))
    from warehouse import Warehouse
    wh = Warehouse(home / "warehouse")
    (run,) = wh.query("select run_id, started_at, finished_at, stop_reason, gpu_model from runs_latest").to_pylist()
    rid = run["run_id"]
    att = wh.query("select count(*) as n, sum(gpu_seconds) as gpu_s, min(created_at) as t0, max(created_at) as t1 "
                   "from attempts where run_id = ?", [rid]).to_pylist()[0]
    outcomes = {r["outcome"]: r["n"] for r in wh.query(
        "select outcome, count(*) as n from attempts where run_id = ? group by 1", [rid]).to_pylist()}
    stages = {r["stage"]: r for r in wh.query(
        "select stage, sum(wall_s) as wall_s, sum(work_s) as work_s, sum(n_in) as n_in, max(workers) as workers "
        "from stage_times where run_id = ? group by stage", [rid]).to_pylist()}
    gpus = 0 if args.cpu else max(1, int((stages.get("time") or {}).get("workers") or 1))
    run_wall = (run["finished_at"] - run["started_at"]).total_seconds()
    reserved = ((stages.get("time") or {}).get("wall_s") or 0.0) * gpus
    reserved += ((stages.get("final") or {}).get("wall_s") or 0.0) * gpus
    best = wh.query("select basis, score_ms, tactic, ir_hash, generation from run_best where run_id = ?",
                    [rid]).to_pylist()
    base = wh.query("select name, source, basis, score_ms from baseline_scores where run_id = ? "
                    "order by source, score_ms nulls last", [rid]).to_pylist()
    per_shape = wh.query("select shape, median_ms, confirm_ms, attempt_id from shape_best where run_id = ? "
                         "order by shape", [rid]).to_pylist()
    big = {r["shape"]: r for r in per_shape if r["shape"] in BIG_GEMM}
    hand_big = {(r["name"], r["shape"]): r["median_ms"] for r in wh.query(
        "select name, shape, median_ms from baselines where run_id = ? and shape in (?, ?)",
        [rid, *BIG_GEMM]).to_pylist()}
    n = att["n"] or 0
    row.update({
        "run_id": rid, "gpu_model": run["gpu_model"], "gpu_runners": gpus, "stop_reason": run["stop_reason"],
        "candidates": n,
        "outcomes": outcomes, "gpu_busy_s": round(att["gpu_s"] or 0.0, 2), "gpu_reserved_s": round(reserved, 2),
        "run_wall_s": round(run_wall, 1),
        "per_gpu_minute_busy": round(n / ((att["gpu_s"] or 0) / 60), 1) if att["gpu_s"] else None,
        "per_gpu_minute_reserved": round(n / (reserved / 60), 1) if reserved else None,
        "per_wall_minute": round(n / (run_wall / 60), 1) if run_wall else None,
        "per_wall_minute_command": round(n / (wall / 60), 1),
        "stages": {s: {"wall_s": round(v["wall_s"], 2), "work_s": round(v["work_s"], 2), "n_in": v["n_in"],
                       "workers": v["workers"]} for s, v in stages.items()},
        "best": best[0] if best else None, "baselines": base, "per_shape": per_shape,
        "big_gemm": {k: {"ours_ms": v["median_ms"], **{n_: ms for (n_, s), ms in hand_big.items() if s == k}}
                     for k, v in big.items()}})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--home", default="/tmp/cake-throughput", help="CAKE_HOME of each run goes under it")
    ap.add_argument("--cpu", action="store_true", help="reduced mode without a GPU (cost model as score)")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated problems to run (default: all)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per command")
    ap.add_argument("--gpus", default="", help="GPU runners per run (CAKE_GPU_COUNT), comma-separated to run "
                                               "each problem once per count, e.g. 1,2,4 (default: every GPU)")
    args = ap.parse_args()
    try:
        counts = [int(n) for n in args.gpus.split(",") if n.strip()] or [None]
    except ValueError:
        ap.error(f"--gpus {args.gpus!r}: expected counts such as 1,2,4")
    if any(n is not None and n < 1 for n in counts):
        ap.error(f"--gpus {args.gpus!r}: every count must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for problem, shapes, check in RUNS:
        if args.only and problem not in args.only.split(","):
            continue
        for n in counts:
            rows.append(run_one(problem, shapes, check, args, out, n))
        summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
                   "cpu_count": os.cpu_count(), "mode": "cpu (cost model as score)" if args.cpu else "gpu",
                   "argv": sys.argv[1:], "runs": rows}
        (out / "evolve_throughput.json").write_text(json.dumps(summary, indent=2, default=str))

    print(f"\nevolve throughput ({'CPU reduced mode: checked on the interpreter, scored by the cost model' if args.cpu else 'GPU'}"
          f"; {os.cpu_count()} cores)")
    print(f"{'run':<34}{'gpus':>5}{'cand':>6}{'/GPU-min':>10}{'busy':>8}{'/wall-min':>11}{'cmd':>7}{'wall s':>8}  stop")
    ok = True
    for r in rows:
        name = r["command"].split()[2] + "/" + r["command"].split()[4]
        if r["exit"] != 0:
            name += f" ({r['gpus_asked']} GPUs asked)" if r["gpus_asked"] else ""
            print(f"{name:<34}  FAILED (exit {r['exit']}): {r.get('error', '')[:90]}")
            ok = False
            continue
        g = r["per_gpu_minute_reserved"]
        print(f"{name:<34}{r['gpu_runners'] or '-':>5}{r['candidates']:>6}{(f'{g:.0f}' if g else '-'):>10}"
              f"{(str(round(r['per_gpu_minute_busy'])) if r['per_gpu_minute_busy'] else '-'):>8}"
              f"{r['per_wall_minute']:>11.1f}{r['per_wall_minute_command']:>7.1f}{r['run_wall_s']:>8.0f}  "
              f"{r['stop_reason']}")
        if not args.cpu:
            ok &= (g or 0) >= TARGET_PER_GPU_MIN and r["per_wall_minute"] >= TARGET_PER_WALL_MIN
    print(f"{'stage wall s (worker s)':<34}" + "".join(f"{s[:8]:>10}" for s in STAGES))
    for r in rows:
        if r["exit"] == 0:
            name = r["command"].split()[2] + (f" on {r['gpu_runners']} GPU(s)" if len(counts) > 1 else "")
            print(f"{name:<34}" + "".join(
                f"{(str(round(r['stages'][s]['wall_s'], 1)) + '(' + str(round(r['stages'][s]['work_s'])) + ')') if s in r['stages'] else '-':>10}"
                for s in STAGES))
    for r in rows:
        if r["exit"] == 0:
            b = r["best"]
            line = f"{r['command'].split()[2]}: best {b['score_ms']:.4g} ms ({b['basis']})" if b else \
                f"{r['command'].split()[2]}: no correct kernel"
            line += "".join(f"; {x['name']} {x['score_ms']:.4g} ms ({x['basis']})" for x in r["baselines"]
                            if x["score_ms"] is not None)
            print(line)
            for shape, v in r["big_gemm"].items():
                print(f"  {shape}: ours {v['ours_ms']:.4g} ms; " + ", ".join(
                    f"{k} {ms:.4g} ms" for k, ms in v.items() if k != "ours_ms" and ms is not None))
    if not args.cpu:
        print(f"target (H200): >= {TARGET_PER_GPU_MIN:.0f} candidates per GPU-minute (reserved) and >= "
              f"{TARGET_PER_WALL_MIN:.0f} per wall-minute: {'MET' if ok else 'NOT MET'}")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
