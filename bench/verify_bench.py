"""Time of `verify()` (every rule, the protocol checker included) on the warp-specialized GEMM seed, one core.

    .venv/bin/python bench/verify_bench.py --runs 50 --out bench/results/verify.json

Median over `--runs` runs after two warm-up runs; the process is pinned to one
core where the OS allows it. The target is well under 50 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir.protocol import check_protocol  # noqa: E402
from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.ir.rule_ctx import build_ctx  # noqa: E402
from cake_core.ir.verify import verify  # noqa: E402
from cake_core.targets import get_arch  # noqa: E402

SEED = Path(__file__).resolve().parents[1] / "cake_core/problems/seeds/gemm_bf16_ws.cake"
TARGET_MS = 50.0


def _times(fn, runs: int) -> list[float]:
    for _ in range(2):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path("bench/results/verify.json"))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    prog = parse_program(SEED.read_text(), SEED.name)
    diags = verify(prog)
    if diags:
        print("the seed does not verify:", *[d.format(SEED.name) for d in diags], sep="\n")
        return 1
    total = _times(lambda: verify(prog), args.runs)
    target = get_arch(prog.target)
    proto = _times(lambda: check_protocol(build_ctx(prog, target)), args.runs)
    res = {"program": prog.name, "hash": prog.hash, "runs": args.runs, "cores": 1,
           "verify_median_ms": round(statistics.median(total), 3), "verify_min_ms": round(min(total), 3),
           "verify_max_ms": round(max(total), 3), "protocol_median_ms": round(statistics.median(proto), 3),
           "target_ms": TARGET_MS, "python": platform.python_version(), "machine": platform.machine(),
           "date": time.strftime("%Y-%m-%d")}
    print(f"verify(gemm_bf16_ws): median {res['verify_median_ms']} ms over {args.runs} runs on one core "
          f"(protocol checker alone {res['protocol_median_ms']} ms; target < {TARGET_MS} ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["verify_median_ms"] < TARGET_MS else 2


if __name__ == "__main__":
    sys.exit(main())
