"""What the gate's references cost on the GPU against the CPU, per problem, at the headline shapes.

For each headline shape of each problem's largest shape set: the device draw of the inputs, the fp64
reference on the device (first call: computed; second: from the cache under a temporary Cake home), the
device comparison of a correct output against it, the incremental perturbation's one-row oracle, and the
numpy oracle on 256 rows scaled to the whole output (what the CPU gate would pay; the full numpy oracle
of the largest cells takes minutes). Prints a short table last; the full figures go to
``$OUT/gpu_references.json`` (or ``--out``).

    python3 bench/gpu_references.py [--problems kmeans_assign,knn_topk] [--out DIR]
    python3 bench/gpu_references.py --cpu     # numpy, small shapes: the script itself, without a GPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.problems import list_problems, load_shape_set  # noqa: E402

PROBLEMS = {p.name: p for p in list_problems()}
from cake_core.problems.base import input_sampler, shape_key, to_host  # noqa: E402
from cake_core.runtime.gate import compare_to, pick_rows  # noqa: E402
from cake_core.runtime.references import ReferenceCache, reference  # noqa: E402


def _sync(cp) -> None:
    if cp is not np:
        cp.cuda.Device().synchronize()


def _timed(cp, fn):
    t0 = time.perf_counter()
    out = fn()
    _sync(cp)
    return out, time.perf_counter() - t0


def bench_shape(cp, p, shape: dict, home: Path) -> dict:
    row: dict = {"problem": p.name, "shape": shape_key(shape)}
    inputs, row["inputs_s"] = _timed(cp, lambda: p.make_inputs(shape, input_sampler(0, shape, cp)))
    cache = ReferenceCache(home / "refs")
    ref, row["reference_s"] = _timed(cp, lambda: reference(p, inputs, shape, 0, device="cuda:bench", cache=cache))
    row["reference_source"] = ref.source
    again, row["cached_s"] = _timed(cp, lambda: reference(p, inputs, shape, 0, device="cuda:bench", cache=cache))
    row["cached_source"] = again.source
    ints = p.name in ("kmeans_assign", "knn_topk")
    got = {n: cp.asarray(ref.want[n]).astype(cp.int32 if ints or n == "counts" else cp.float32) for n in p.outputs}
    (ok, err, msg), row["compare_s"] = _timed(cp, lambda: compare_to(p, got, ref))
    row.update(correct=ok, max_error=err, message=msg)
    fed = p.rows.rows_of_perturbed(inputs, np.array([0]))
    _, row["perturb_rows_s"] = _timed(cp, lambda: p.oracle_rows(inputs, fed))
    rows = pick_rows(p, shape, 256, 1)
    host = {k: to_host(v) if not k.startswith("_") else v for k, v in inputs.items()}
    t0 = time.perf_counter()
    p.oracle_rows(host, rows)
    row["numpy_full_estimate_s"] = (time.perf_counter() - t0) * p.rows.count(shape) / rows.size
    del inputs, ref, again, got, host
    if cp is not np:
        cp.get_default_memory_pool().free_all_blocks()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=",".join(sorted(PROBLEMS)))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cpu", action="store_true", help="numpy instead of CuPy, on each problem's first (small) "
                                                        "shape set: a smoke test of this script without a GPU")
    args = ap.parse_args()
    if args.cpu:
        cp = np
    else:
        import cupy as cp

    rows = []
    with tempfile.TemporaryDirectory() as home:
        for name in args.problems.split(","):
            p = PROBLEMS[name]
            ss = load_shape_set(p, p.shape_sets[0 if args.cpu else -1])
            for shape, role in zip(ss.shapes, ss.roles):
                if role != "headline":
                    continue
                try:
                    r = bench_shape(cp, p, dict(shape), Path(home))
                except Exception as e:  # noqa: BLE001 - one shape's failure is a row, not the end of the bench
                    r = {"problem": name, "shape": shape_key(shape), "error": f"{type(e).__name__}: {e}"}
                rows.append(r)
                print(json.dumps(r), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_references.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'problem':14s} {'shape':34s} {'inputs':>8s} {'ref':>8s} {'cached':>8s} {'compare':>8s} "
          f"{'1-row':>8s} {'numpy est':>10s}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:14s} {r['shape']:34s} {r['error']}")
            continue
        print(f"{r['problem']:14s} {r['shape']:34s} {r['inputs_s']:8.3f} {r['reference_s']:8.3f} {r['cached_s']:8.3f} "
              f"{r['compare_s']:8.3f} {r['perturb_rows_s']:8.3f} {r['numpy_full_estimate_s']:10.1f}  "
              f"{'yes' if r['correct'] else 'NO'} ({r['cached_source']})")
    print("seconds; ref: fp64 on the GPU, first call; cached: the second call; numpy est: the CPU oracle "
          "on 256 rows scaled to all")


if __name__ == "__main__":
    main()
