"""Does TMA pay for the out-of-bounds rows of tinygemm's A tile? A probe on the GPU.

    PYTHONPATH=. python3 bench/tinygemm_a_rows.py [--program cake_core/problems/tinygemm/kernels/tinygemm_rows.cake] [--out DIR]

tinygemm's programs load A (M x K, M <= 64) as a 64-row TMA box per stage; at M = 1 63 of its rows are out
of bounds and zero-filled. The 64-column programs slow down as M falls although they read the same weight
bytes (corpus-vs-peers-2026-11-29e.md). This probe lowers a program, then rebuilds it with A's box cut to R
rows (R >= M; the tile's other rows keep whatever smem held: they only feed accumulator rows past M, which are
never stored) and the stage's expected bytes cut to match, and runs both through the correctness gate and
the timing protocol of cake_core.runtime.gpu at M <= R. The IR cannot express the cut yet; the probe says
whether it is worth expressing. Prints a table; writes tinygemm_a_rows.json under --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402

EXPECT = "(((BM * BK) + (BK * BN)) * 2)"     # the program's expect_tx bytes, as lowered


def cut_a_rows(lk, rows: int):
    """``lk`` with A's TMA box cut to ``rows`` rows and the stage's expected bytes cut to match."""
    if EXPECT not in lk.source:
        raise SystemExit(f"tinygemm_a_rows: the lowered source has no `{EXPECT}`; the probe needs the "
                         "expect_tx of tinygemm_splitk / tinygemm_rows")
    maps = tuple(dataclasses.replace(m, box=(rows,) + tuple(m.box[1:])) if m.gmem == "a" else m
                 for m in lk.tensor_maps)
    return dataclasses.replace(lk, tensor_maps=maps,
                               source=lk.source.replace(EXPECT, f"((({rows} * BK) + (BK * BN)) * 2)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="cake_core/problems/tinygemm/kernels/tinygemm_rows.cake")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    try:
        from cake_core.runtime.gpu import check_and_time, gpu_model
        gpu = gpu_model()
    except Exception as e:  # noqa: BLE001 - no GPU: say so
        print(f"tinygemm_a_rows: needs a CUDA GPU ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    tiny = get_problem("tinygemm")
    text = Path(args.program).read_text()
    lr = lower(parse_program(text, args.program), args.program)
    if not lr.ok:
        print("\n".join(d.format(args.program) for d in lr.diagnostics), file=sys.stderr)
        return 2
    cache = Path(tempfile.mkdtemp(prefix="cake-probe-"))
    rows_out = []
    for rows, ms in ((64, (1, 8, 16, 64)), (8, (1, 8)), (16, (16,))):
        lk = lr.value if rows == 64 else cut_a_rows(lr.value, rows)
        cr = compile_kernel(lk, arch="sm_90a", cache_dir=cache)
        if not cr.ok:
            print("; ".join(d.message for d in cr.diagnostics), file=sys.stderr)
            return 1
        shapes = [{"M": m, "N": n, "K": n} for n in (int(s) for s in args.sizes.split(",")) for m in ms]
        for r in check_and_time(cr.value, lk, tiny, shapes, seed=7, reps=args.reps, timeout_s=30):
            rows_out.append({"a_box_rows": rows, "shape": r.shape, "correct": r.correct, "outcome": r.outcome,
                             "median_ms": r.median_ms, "message": r.message})
    result = {"script": "bench/tinygemm_a_rows.py", "program": args.program, "gpu": gpu,
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows_out}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tinygemm_a_rows.json").write_text(json.dumps(result, indent=1))
    print(f"{'A box rows':>10} {'shape':>22} {'correct':>8} {'median us':>10}")
    for r in rows_out:
        key = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        med = f"{1e3 * r['median_ms']:.1f}" if r["median_ms"] else r["outcome"]
        print(f"{r['a_box_rows']:>10} {key:>22} {str(r['correct']):>8} {med:>10}")
    return 0 if all(r["correct"] for r in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
