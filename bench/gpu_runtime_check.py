"""Lower, compile, check and time the gemm_bf16 seed on the GPU over gemm_small + gemm_square.

    PYTHONPATH=. python3 bench/gpu_runtime_check.py [--sets gemm_small,gemm_square] [--reps 20]
    PYTHONPATH=. python3 bench/gpu_runtime_check.py --atoms fma,mma_sync --sets gemm_square --only-square 1024,2048,4096

``--atoms`` times the seed once per MMA atom (the seed's ``mma(...)`` rewritten to that atom);
``--only-square`` keeps the M=N=K shapes of the listed sizes.

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
    ap.add_argument("--atoms", default="fma", help="comma-separated MMA atoms to time the seed with")
    ap.add_argument("--only-square", default="", help="keep only M=N=K shapes of these sizes, e.g. 1024,2048")
    ap.add_argument("--json-name", default="gpu_runtime_check.json")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    prob = get_problem(args.problem)
    model = gpu_model()
    print(f"gpu: {model}")
    t0 = time.perf_counter()
    keep = {int(x) for x in args.only_square.split(",") if x}
    rows, kernels = [], {}
    for atom in args.atoms.split(","):
        text = prob.seed_text()
        if atom != "fma":
            text = text.replace("mma(acc, a_s, b_s)", f'mma(acc, a_s, b_s, atom="{atom}")')
            assert atom in text, f"the seed has no `mma(acc, a_s, b_s)` to rewrite to atom={atom}"
        lr = lower(parse_program(text, "kernel.cake"))
        if not lr.ok:
            print("\n".join(d.format("kernel.cake") for d in lr.diagnostics))
            return 1
        with tempfile.TemporaryDirectory(prefix="cake-cubins-") as cache:
            cr = compile_kernel(lr.value, cache_dir=Path(cache))
            if not cr.ok:
                print("\n".join(d.format("kernel.cake") for d in cr.diagnostics))
                return 1
            c = cr.value
            kernels[atom] = {"kernel": c.kernel_name, "arch": c.arch, "resources": asdict(c.resources)}
            print(f"[{atom}] compiled {c.kernel_name} for {c.arch} in {c.seconds:.2f} s: {c.resources}")
            for set_name in args.sets.split(","):
                ss = prob.shape_set(set_name)
                for shape, role in zip(ss.shapes, ss.roles):
                    if keep and not (len(set(shape.values())) == 1 and next(iter(shape.values())) in keep):
                        continue
                    ts = time.perf_counter()
                    (r,) = check_and_time(c, lr.value, prob, [shape], seed=args.seed, reps=args.reps)
                    row = asdict(r) | {"atom": atom, "set": set_name, "role": role,
                                       "wall_s": time.perf_counter() - ts,
                                       "tflops": prob.flops(shape) / (r.median_ms * 1e-3) / 1e12 if r.median_ms
                                       else None}
                    rows.append(row)
                    med = f"{r.median_ms:.4f}" if r.median_ms else "-"
                    spread = f"{r.p10_ms:.4f}..{r.p90_ms:.4f}" if r.p10_ms else "-"
                    tf = f"{row['tflops']:.2f}" if row["tflops"] else "-"
                    print(f"{atom:<9}{set_name:<12}{shape_key(shape):<24}{role:<9}{'ok' if r.correct else 'WRONG':<6}"
                          f"{r.max_error:>10.2e}{med:>10} {spread:<18}{tf:>7} TFLOP/s  {r.outcome}"
                          + ("" if r.correct else f"  {r.message}"), flush=True)
    print(f"total {time.perf_counter() - t0:.1f} s; timer {rows[0]['timer'] if rows else '-'}, L2 cold")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / args.json_name).write_text(json.dumps(
            {"gpu": model, "kernels": kernels, "rows": rows}, indent=2, default=str))
    atoms = args.atoms.split(",")
    if len(atoms) > 1:       # a speed-up table last: each atom against the first
        print(f"\n{'shape':<24}" + "".join(f"{a + ' ms':>14}" for a in atoms)
              + "".join(f"{a + '/' + atoms[0]:>18}" for a in atoms[1:]))
        for key in dict.fromkeys(shape_key(r["shape"]) for r in rows):
            ms = {r["atom"]: r["median_ms"] for r in rows if shape_key(r["shape"]) == key}
            cells = "".join(f"{ms.get(a) or float('nan'):>14.4f}" for a in atoms)
            ups = "".join(f"{(ms[atoms[0]] / ms[a]) if ms.get(a) and ms.get(atoms[0]) else float('nan'):>17.2f}x"
                          for a in atoms[1:])
            print(f"{key:<24}{cells}{ups}")
    return 0 if all(r["correct"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
