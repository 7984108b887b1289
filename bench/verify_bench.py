"""Time of `verify()` (every rule, the protocol checker included) on every corpus kernel and every tactic chain,
one core.

    .venv/bin/python bench/verify_bench.py --runs 5 --out bench/results/verify.json

Each program: the median over ``--runs`` runs after one warm-up run, of ``verify()`` and of the protocol checker
alone (with the simulated ops it spent). The process is pinned to one core where the OS allows it; times are the
CPU time of the process (what the check costs one core, whatever else the machine runs), with the wall time
beside it (equal on an idle machine). The target:
every kernel verified in under TARGET_MS, and decided (no ``protocol.undecided``). Prints one row per program
and a summary line last; writes the figures as JSON to ``--out``; exit 2 when a kernel misses the target, 1 when
a corpus kernel does not verify.
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
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir import protocol  # noqa: E402
from cake_core.ir.program import Program  # noqa: E402
from cake_core.ir.rule_ctx import build_ctx  # noqa: E402
from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.ir.verify import verify  # noqa: E402
from cake_core.targets import get_arch  # noqa: E402
from cake_core.problems import corpus_files  # noqa: E402

TARGET_MS = 1000.0


def _times(fn: Callable[[], Any], runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each run after one warm-up run."""
    fn()
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def programs(chains: bool = True) -> list[tuple[str, Program]]:
    """(label, program) of every corpus kernel, then of every tactic chain that builds."""
    out = [(f.stem, parse_program(f.read_text(), f.name)) for f in corpus_files("*.cake")]
    if chains:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import tactic_chains
        for problem, name, pre, tactics, post, bounds in tactic_chains.CHAINS:
            p = tactic_chains.build(problem, pre, tactics, post, bounds)
            if isinstance(p, Program):
                out.append((f"{problem}__{name}", p))
            else:
                print(f"chain {problem}__{name} refused: {p}", file=sys.stderr)
    return out


def _steps(prog: Program) -> int:
    """The simulated ops the protocol checker spends on ``prog``."""
    spent = []
    real = protocol.Budget

    def counting(limit: int) -> Any:
        b = real(limit)
        spent.append(b)
        return b
    protocol.Budget = counting
    try:
        protocol.check_protocol(build_ctx(prog, get_arch(prog.target)))
    finally:
        protocol.Budget = real
    return spent[0].used if spent else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-chains", action="store_true", help="the corpus kernels only")
    ap.add_argument("--out", type=Path, default=Path("bench/results/verify.json"))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rows, bad = [], []
    for label, prog in programs(not args.no_chains):
        diags = verify(prog)
        errors = [d for d in diags if d.is_error]
        if errors:
            bad.append(label)
            print(f"{label} does not verify:", *[d.format(label) for d in errors[:3]], sep="\n  ", file=sys.stderr)
        target = get_arch(prog.target)
        wall, cpu = _times(lambda: verify(prog), args.runs)
        _, proto = _times(lambda: protocol.check_protocol(build_ctx(prog, target)), args.runs)
        rows.append({"program": label, "hash": prog.hash, "verify_median_ms": round(statistics.median(cpu), 2),
                     "verify_max_ms": round(max(cpu), 2), "verify_wall_median_ms": round(statistics.median(wall), 2),
                     "protocol_median_ms": round(statistics.median(proto), 2), "protocol_steps": _steps(prog),
                     "errors": [d.rule for d in errors]})
    res = {"runs": args.runs, "cores": 1, "target_ms": TARGET_MS, "max_steps": protocol.MAX_STEPS,
           "python": platform.python_version(), "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"),
           "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, "programs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print("| program | verify CPU ms (median) | verify wall ms | protocol CPU ms | protocol ops |\n"
          "|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['program']} | {r['verify_median_ms']} | {r['verify_wall_median_ms']} | {r['protocol_median_ms']} "
              f"| {r['protocol_steps']} |")
    slow = [r["program"] for r in rows if r["verify_median_ms"] >= TARGET_MS]
    worst = max(rows, key=lambda r: r["verify_median_ms"])
    print(f"\n{len(rows)} programs, {len(bad)} not verifying, {len(slow)} at or over {TARGET_MS:.0f} ms; slowest "
          f"{worst['program']} {worst['verify_median_ms']} ms CPU (median of {args.runs}, one core, load "
          f"{res['load_avg']})")
    return 1 if bad else 2 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
