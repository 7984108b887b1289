"""Compile throughput of the lower+nvcc stages on one core: cold (distinct sources) and cached.

    .venv/bin/python bench/lower_bench.py --n 12 --out bench/lower_bench.json

Cold kernels differ in their consts (BM, BN, BK), so every one is a distinct
source and a real nvcc run; the cached pass compiles the same kernels again.
nvcc is pinned to one core with `taskset` where available.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402


def variants(n: int):
    seed = parse_program(get_problem("gemm_bf16").seed_text(), "kernel.cake")
    grid = itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32, 64))
    out = []
    for bm, bn, bk in grid:
        if (bm * bn) % seed.threads == 0:
            out.append(seed.with_consts(BM=bm, BN=bn, BK=bk))
        if len(out) == n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12, help="distinct kernels to compile cold")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})   # one core; nvcc inherits it
    progs = variants(args.n)
    with tempfile.TemporaryDirectory(prefix="cake-bench-") as tmp:
        cache = Path(tmp)
        rows = []
        for phase in ("cold", "cached"):
            per, lower_s, regs = [], [], []
            t_all = time.perf_counter()
            for p in progs:
                t0 = time.perf_counter()
                lr = lower(p)
                t1 = time.perf_counter()
                cr = compile_kernel(lr.value, arch=args.arch, cache_dir=cache)
                t2 = time.perf_counter()
                assert cr.ok, [d.message for d in cr.diagnostics]
                assert cr.value.cached == (phase == "cached")
                per.append(t2 - t0)
                lower_s.append(t1 - t0)
                regs.append(cr.value.resources.registers)
            wall = time.perf_counter() - t_all
            rows.append({"phase": phase, "kernels": len(progs), "wall_s": wall,
                         "kernels_per_min": 60 * len(progs) / wall, "median_s": statistics.median(per),
                         "max_s": max(per), "lower_median_ms": 1e3 * statistics.median(lower_s),
                         "registers": f"{min(regs)}..{max(regs)}"})
    print(f"compile throughput, {args.arch}, one core ({platform.processor() or platform.machine()})")
    print(f"{'phase':<8}{'kernels':>8}{'wall s':>9}{'k/min':>9}{'median s':>10}{'max s':>8}{'lower ms':>10}  regs")
    for r in rows:
        print(f"{r['phase']:<8}{r['kernels']:>8}{r['wall_s']:>9.2f}{r['kernels_per_min']:>9.0f}"
              f"{r['median_s']:>10.3f}{r['max_s']:>8.3f}{r['lower_median_ms']:>10.2f}  {r['registers']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"arch": args.arch, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
