"""The README's main command while another CPU-heavy job runs: it must succeed, and leave nothing running.

    uv run --locked python bench/readme_under_load.py --out OUT [--hogs 2] [--runs 1]

Starts ``--hogs`` processes that spin on the CPU, then runs ``cake evolve
gemm_bf16 --shapes gemm_small`` (on the CPU: CAKE_GPU=off) in a fresh home
``--runs`` times, each with the embedded Prefect server and a local Ray. Every
process a run starts inherits a marker in its environment; after each run the
script counts those still alive. Full results go to ``OUT/readme_under_load.json``;
a short table is printed last.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAKE = str(Path(sys.executable).parent / "cake")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_with(marker: str) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    n += 1
            except OSError:
                continue
    return n


def _one_run(home: Path) -> dict:
    marker = f"CAKE_BENCH_MARK={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAKE_", "PREFECT_"))}
    env.update({"CAKE_HOME": str(home), "CAKE_GPU": "off", "CAKE_PREFECT_PORT": str(_free_port()),
                marker.split("=")[0]: marker.split("=")[1]})
    t0 = time.monotonic()
    p = subprocess.run([CAKE, "evolve", "gemm_bf16", "--shapes", "gemm_small"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    time.sleep(2)
    return {"exit_code": p.returncode, "wall_s": round(wall, 1), "left_alive": _alive_with(marker),
            "load_after": os.getloadavg(), "stdout": p.stdout, "stderr": p.stderr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes beside the run")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    hogs = [mp.Process(target=_spin, args=(3600.0,), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    time.sleep(3)
    results = []
    try:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="cake-load-") as home:
                load_before = os.getloadavg()
                r = _one_run(Path(home))
                results.append({"load_before": load_before, **r})
    finally:
        for h in hogs:
            h.kill()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "readme_under_load.json").write_text(json.dumps(
        {"command": "cake evolve gemm_bf16 --shapes gemm_small", "cpus": os.cpu_count(), "hogs": args.hogs,
         "runs": results}, indent=1))
    print(f"\n{'run':>3}  {'exit':>4}  {'wall s':>7}  {'load 1 min before/after':>24}  {'left alive':>10}")
    for i, r in enumerate(results):
        print(f"{i:>3}  {r['exit_code']:>4}  {r['wall_s']:>7}  "
              f"{r['load_before'][0]:>11.1f} / {r['load_after'][0]:<10.1f}  {r['left_alive']:>10}")
    if any(r["exit_code"] or r["left_alive"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
