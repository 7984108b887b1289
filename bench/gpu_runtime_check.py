"""Lower, compile, check and time the gemm_bf16 seed on the GPU over gemm_small + gemm_square.

    PYTHONPATH=. python3 bench/gpu_runtime_check.py [--sets gemm_small,gemm_square] [--reps 20]

Prints one row per shape (correct, max error, median/p10/p90 ms, TFLOP/s) and
writes gpu_runtime_check.json under $OUT (or --out) when set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.problems import get_problem, shape_key  # noqa: E402
from cake_core.runtime.gpu import check_and_time, gpu_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="gemm_bf16")
    ap.add_argument("--sets", default="gemm_small,gemm_square")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    prob = get_problem(args.problem)
    model = gpu_model()
    print(f"gpu: {model}")
    t0 = time.perf_counter()
    lr = lower(parse_program(prob.seed_text(), "kernel.cake"))
    if not lr.ok:
        print("\n".join(d.format("kernel.cake") for d in lr.diagnostics))
        return 1
    with tempfile.TemporaryDirectory(prefix="cake-cubins-") as cache:
        cr = compile_kernel(lr.value, cache_dir=Path(cache))
        if not cr.ok:
            print("\n".join(d.format("kernel.cake") for d in cr.diagnostics))
            return 1
        c = cr.value
        print(f"compiled {c.kernel_name} for {c.arch} in {c.seconds:.2f} s: {c.resources}")
        rows = []
        for set_name in args.sets.split(","):
            ss = prob.shape_set(set_name)
            for shape, role in zip(ss.shapes, ss.roles):
                ts = time.perf_counter()
                (r,) = check_and_time(c, lr.value, prob, [shape], seed=args.seed, reps=args.reps)
                row = asdict(r) | {"set": set_name, "role": role, "wall_s": time.perf_counter() - ts,
                                   "tflops": prob.flops(shape) / (r.median_ms * 1e-3) / 1e12 if r.median_ms else None}
                rows.append(row)
                med = f"{r.median_ms:.4f}" if r.median_ms else "-"
                spread = f"{r.p10_ms:.4f}..{r.p90_ms:.4f}" if r.p10_ms else "-"
                tf = f"{row['tflops']:.2f}" if row["tflops"] else "-"
                print(f"{set_name:<12}{shape_key(shape):<24}{role:<9}{'ok' if r.correct else 'WRONG':<6}"
                      f"{r.max_error:>10.2e}{med:>10} {spread:<18}{tf:>7} TFLOP/s  {r.outcome}"
                      + ("" if r.correct else f"  {r.message}"), flush=True)
    print(f"total {time.perf_counter() - t0:.1f} s; timer {rows[0]['timer'] if rows else '-'}, L2 cold")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_runtime_check.json").write_text(json.dumps(
            {"gpu": model, "kernel": c.kernel_name, "arch": c.arch, "resources": asdict(c.resources),
             "rows": rows}, indent=2, default=str))
    return 0 if all(r["correct"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
