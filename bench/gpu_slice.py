"""The whole slice on a GPU machine: `cake evolve` (Prefect flow, Ray GPU actor, CuPy, warehouse), then a report.

Run on the H200 from the repository root, with the bundle of what its image
lacks (prefect, ray, duckdb, great-expectations, openai, pydantic-settings,
tenacity; built by ../shared/gpu/make-bundle.sh into .gpu/site.tar.xz):

    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site \
      && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH \
      && python3 bench/gpu_slice.py --out $OUT

It runs the README's main command (`cake evolve`) with CAKE_GPU=require,
then reads the warehouse back: outcomes, measured timings per shape of the
best kernel, the dispatch table. Full results go to --out (CSV + JSON); a
short table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--problem", default="gemm_bf16")
    ap.add_argument("--shapes", default="gemm_small")
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--population", type=int, default=6)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    home = Path("/tmp/cake-slice-home")
    env = {**os.environ, "CAKE_HOME": str(home), "CAKE_GPU": "require", "PYTHONUNBUFFERED": "1",
           "PREFECT_HOME": str(home / "prefect")}
    cmd = [sys.executable, "-c", "from cake_cli.main import app; app()", "evolve", args.problem,
           "--shapes", args.shapes, "--generations", str(args.generations), "--population", str(args.population)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    wall = time.monotonic() - t0
    (out / "evolve.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    print(proc.stdout[-3000:])
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        print(f"cake evolve failed with exit code {proc.returncode}")
        return 1

    sys.path.insert(0, str(ROOT))
    from warehouse import Warehouse
    wh = Warehouse(home / "warehouse")
    outcomes = wh.query("select outcome, count(*) as n, round(sum(gpu_seconds), 2) as gpu_s from attempts "
                        "group by 1 order by 2 desc").to_pylist()
    confirmed = wh.query("""
        select c.shape, s.median_ms as search_ms, c.median_ms as confirm_ms
        from measurements c join measurements s on s.attempt_id = c.attempt_id and s.shape = c.shape
        where c.kind = 'confirm' and s.kind = 'search' order by c.shape""").to_pylist()
    best = wh.query("""
        select m.shape, m.gpu_model, m.timer, m.l2, m.median_ms, m.p10_ms, m.p90_ms, m.runs, m.max_error,
               a.tactic, a.ir_hash
        from measurements m join attempts a using (attempt_id)
        where m.kind = 'search'
        qualify row_number() over (partition by m.shape order by m.median_ms) = 1
        order by m.shape""").to_pylist()
    wh.export("select * from attempts", out / "attempts.csv", "csv")
    wh.export("select * from measurements", out / "measurements.csv", "csv")
    wh.export("select * from dispatch", out / "dispatch.csv", "csv")
    gpu = best[0]["gpu_model"] if best else None
    summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(cmd[3:]),
               "machine": f"{gpu or 'no GPU'}; {platform.node()}", "wall_s": round(wall, 1),
               "outcomes": outcomes, "best_per_shape": best, "confirmed": confirmed}
    (out / "gpu_slice.json").write_text(json.dumps(summary, indent=2, default=str))

    print(f"\nslice on {gpu}: cake evolve finished in {wall:.0f} s")
    print("outcomes (GPU s held): " + ", ".join(f"{r['outcome']}={r['n']} ({r['gpu_s']} s)" for r in outcomes))
    print("confirmed winners (search → confirm ms): " +
          ", ".join(f"{r['shape']} {r['search_ms']:.4f}→{r['confirm_ms']:.4f}" for r in confirmed))
    print(f"{'shape':<22}{'median ms':>11}{'p10':>10}{'p90':>10}{'runs':>6}  tactic")
    for r in best:
        print(f"{r['shape']:<22}{r['median_ms']:>11.4f}{r['p10_ms']:>10.4f}{r['p90_ms']:>10.4f}{r['runs']:>6}  "
              f"{r['tactic']}")
    measured = sum(r["n"] for r in outcomes if r["outcome"] == "measured")
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
