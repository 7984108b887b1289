"""Fault isolation on the GPU: good, faulting, hanging and NaN candidates in one batch through
`tasks.workers.ActorPool` with `GpuRunner` actors (local Ray, one GPU), then the good ones alone.

    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site \
      && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 \
      && python3 bench/gpu_isolation.py --out $OUT

Batch 1 (mixed): the gemm_bf16 seed, a retiled seed and the seed with atom="mma_sync" (good);
an unguarded load offset by 1e8 tiles (illegal address: `runtime_fault`); the k-loop wrapped in
a 2e9-iteration loop (`timeout`: the pool's watchdog kills the actor mid-kernel, a fresh one
takes over); an accumulator filled with inf and then acc - acc (NaN: `wrong`, non-finite).
Batch 2: the good ones alone. Their medians must agree with batch 1's within 10% or within the
p10..p90 spreads. Writes gpu_isolation.json under --out; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402

PROBLEM = "gemm_bf16"


def candidates() -> dict[str, str]:
    """name -> IR text. Names starting with good_ are expected to be measured."""
    seed = get_problem(PROBLEM).seed_text()
    retile = seed.replace('consts={"BK": 32, "BM": 64, "BN": 64}', 'consts={"BK": 32, "BM": 128, "BN": 64}')
    mma = seed.replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')
    fault = seed.replace("load(a_s, a[tile(bid.y, BM), tile(kt, BK)])",
                         "load(a_s, a[tile(bid.y + 100000000, BM), tile(kt, BK)], guard=False)")
    lines = seed.splitlines()
    i = next(j for j, ln in enumerate(lines) if "for kt in range" in ln)
    end = next(j for j, ln in enumerate(lines) if ln.strip().startswith("store("))
    hang = "\n".join(lines[:i] + ["    for spin in range(2000000000):"] + ["    " + ln for ln in lines[i:end]]
                     + lines[end:]) + "\n"
    nan = seed.replace("acc = rmem(f32, (BM, BN))", "acc = rmem(f32, (BM, BN), fill=inf)").replace(
        "    store(c[", '    ewise(acc, acc, acc, fn="sub")\n    store(c[')
    out = {"good_seed": seed, "fault_illegal_address": fault, "good_retile": retile, "hang_spin": hang,
           "good_mma_sync": mma, "nan_inf_minus_inf": nan}
    for name, text in out.items():
        assert name == "good_seed" or text != seed, f"{name}: the rewrite did not apply"
    return out


def build(texts: dict[str, str], cache: Path) -> dict[str, tuple]:
    """name -> (lowered, cubin bytes, kernel name)."""
    out = {}
    for name, text in texts.items():
        lr = lower(parse_program(text, "kernel.cake"))
        if not lr.ok:
            raise SystemExit(f"{name} does not lower: {[d.message for d in lr.diagnostics]}")
        cr = compile_kernel(lr.value, cache_dir=cache)
        if not cr.ok:
            raise SystemExit(f"{name} does not compile: {[d.message for d in cr.diagnostics]}")
        out[name] = (lr.value, Path(cr.value.cubin_path).read_bytes(), cr.value.kernel_name)
    return out


def summarize(answers: list) -> dict:
    """One candidate's verdict from its shapes' answers (ShapeVerdict, or a pool Fault), judged as the time
    stage judges (``cake_core.pipeline.verdicts.judge``)."""
    from cake_core.pipeline.verdicts import fault, judge
    from tasks.workers import Fault
    verdicts = [fault("?", "gpu", a.outcome, a.message) if isinstance(a, Fault) else a for a in answers]
    r = judge("time", verdicts)
    err = next((d for d in r.diagnostics if d.is_error), None)
    return {"outcome": r.outcome.value, "message": err.message if err else "correct",
            "runs": [{"shape": v.shape, "median_ms": v.timing.median_ms if v.timing else None,
                      "p10_ms": v.timing.p10_ms if v.timing else None, "p90_ms": v.timing.p90_ms if v.timing else None}
                     for v in verdicts]}


def run_batch(pool, built: dict[str, tuple], names: list[str], shapes: list[dict], *, seed: int, reps: int,
              timeouts: dict[str, float]) -> tuple[dict[str, dict], float]:
    """Every (candidate, shape) job, one at a time (so the pool's watchdog, not the in-actor one, ends a hang);
    a candidate's remaining shapes are dropped once one faulted, hung or came out wrong."""
    from cake_core.pipeline.execute import GpuJob
    from tasks.workers import Fault, Unit
    units = [Unit((n, j), GpuJob((n, j), built[n][0], built[n][1], built[n][2], PROBLEM, s, seed, reps),
                  timeouts.get(n, 180.0), group=n) for n in names for j, s in enumerate(shapes)]
    failed: set[str] = set()

    def note(key, answer) -> None:
        if isinstance(answer, Fault) or not answer.correct:
            failed.add(key[0])

    t0 = time.monotonic()
    answers = pool.run_units("run_batch", units, batch=1, skip=lambda k: k[0] in failed, on_answer=note)
    wall = time.monotonic() - t0
    return {n: summarize([answers[(n, j)] for j in range(len(shapes)) if (n, j) in answers]) for n in names}, wall


def agree(a: dict, b: dict) -> bool:
    """Medians within 10% of each other, or each inside the other's p10..p90 spread."""
    if a["median_ms"] is None or b["median_ms"] is None:
        return False
    rel = abs(a["median_ms"] - b["median_ms"]) / min(a["median_ms"], b["median_ms"])
    inside = a["p10_ms"] <= b["median_ms"] <= a["p90_ms"] and b["p10_ms"] <= a["median_ms"] <= b["p90_ms"]
    return rel <= 0.10 or inside


_PROBE_RAW = {   # name -> CUDA statement run by one thread; p is a valid float* of 1 MiB
    "null_page_write": "*(volatile float*)16 = 1.0f;",
    "plus_2e43_bytes": "*(volatile float*)((char*)p + (1ll << 43)) = 1.0f;",
    "addr_2e48": "*(volatile float*)(1ll << 48) = 1.0f;",
    "addr_2e56": "*(volatile float*)(1ll << 56) = 1.0f;",
    "addr_all_ones": "*(volatile float*)(~0xfffull) = 1.0f;",
    "misaligned": "*(volatile float*)((char*)p + 1) = 1.0f;",
    "trap": "__trap();",
}


def _probe_one(kind: str, arg: str, timeout_s: float) -> dict:
    """Run one faulting kernel in a fresh process; report what CUDA said and how long it took."""
    import subprocess
    code = f"""
import time, cupy as cp, json, sys
sys.path.insert(0, {str(ROOT)!r})
t0 = time.monotonic()
kind, arg = {kind!r}, {arg!r}
try:
    if kind == "raw":
        k = cp.RawKernel('extern "C" __global__ void f(float* p) {{ if (threadIdx.x == 0 && blockIdx.x == 0) {{ ' + arg + ' }} }}', 'f')
        p = cp.zeros(1 << 18, dtype=cp.float32)
        k((1,), (32,), (p,))
        cp.cuda.Device(0).synchronize()
        print(json.dumps({{"result": "no error", "s": time.monotonic() - t0}}))
    else:
        from bench.gpu_isolation import fault_variants, build, PROBLEM
        from cake_core.problems import get_problem
        from cake_core.runtime.gpu import check_and_time
        import tempfile, pathlib
        text, shapes = fault_variants()[arg]
        with tempfile.TemporaryDirectory() as d:
            from cake_core.ir.text import parse_program
            from cake_core.lower import lower, compile_kernel
            lr = lower(parse_program(text, "kernel.cake")); cr = compile_kernel(lr.value, cache_dir=pathlib.Path(d))
            runs = check_and_time(cr.value, lr.value, get_problem(PROBLEM), shapes, seed=1, time=False, timeout_s={timeout_s - 3})
        print(json.dumps({{"result": runs[0].outcome + ": " + runs[0].message, "s": time.monotonic() - t0}}))
except Exception as e:
    print(json.dumps({{"result": type(e).__name__ + ": " + str(e)[:200], "s": time.monotonic() - t0}}))
"""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                           cwd=ROOT)
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
        out = json.loads(line) if line else {"result": f"exit {p.returncode}: {p.stderr[-300:]}"}
    except subprocess.TimeoutExpired:
        out = {"result": f"HUNG: killed after {timeout_s:g} s"}
    out["wall_s"] = round(time.monotonic() - t0, 2)
    return out


def fault_variants() -> dict[str, tuple[str, list[dict]]]:
    """IR programs that address far outside `a` (unguarded), with the shapes to run them on."""
    seed = get_problem(PROBLEM).seed_text()
    std = "load(a_s, a[tile(bid.y, BM), tile(kt, BK)])"
    return {
        "ir_plus_1e8_tiles": (seed.replace(std, "load(a_s, a[tile(bid.y + 100000000, BM), tile(kt, BK)], guard=False)"),
                              [{"M": 128, "N": 128, "K": 64}]),
        "ir_minus_2e31_rows_bigK": (seed.replace(std, "load(a_s, a[tile(bid.y - 33554432, BM), tile(kt, BK)], "
                                                      "guard=False)"), [{"M": 64, "N": 64, "K": 65536}]),
        "ir_plus_2e31_rows_bigK": (seed.replace(std, "load(a_s, a[tile(bid.y + 33554430, BM), tile(kt, BK)], "
                                                     "guard=False)"), [{"M": 64, "N": 64, "K": 65536}]),
    }


def probe_faults(out: Path, timeout_s: float = 12.0) -> int:
    import subprocess
    rows = {}
    for name, stmt in _PROBE_RAW.items():
        rows[name] = _probe_one("raw", stmt, timeout_s)
        print(f"{name:<28}{rows[name]['wall_s']:>7.2f} s  {rows[name]['result']}", flush=True)
    for name in fault_variants():
        rows[name] = _probe_one("ir", name, timeout_s + 6)
        print(f"{name:<28}{rows[name]['wall_s']:>7.2f} s  {rows[name]['result']}", flush=True)
    try:
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
        xid = [ln for ln in dmesg.splitlines() if "Xid" in ln or "NVRM" in ln][-20:]
    except Exception as e:  # noqa: BLE001
        xid = [f"dmesg: {e}"]
    print("\n".join(xid))
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault_probe.json").write_text(json.dumps({"rows": rows, "dmesg": xid}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe-faults", action="store_true",
                    help="only run raw and IR faulting kernels in subprocesses: does an illegal address fault or hang?")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out")))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--hang-timeout", type=float, default=20.0, help="pool watchdog for the hanging candidate (s)")
    ap.add_argument("--kernel-timeout", type=float, default=60.0, help="GpuRunner's in-actor watchdog per wait (s)")
    args = ap.parse_args()
    if args.probe_faults:
        return probe_faults(args.out)
    import ray

    from tasks.workers import ActorPool, GpuRunner
    shapes = [{"M": 2048, "N": 2048, "K": 2048}, {"M": 1000, "N": 1000, "K": 1000}, {"M": 96, "N": 80, "K": 72}]
    texts = candidates()
    with tempfile.TemporaryDirectory(prefix="cake-iso-") as cache:
        t0 = time.monotonic()
        built = build(texts, Path(cache))
        build_s = time.monotonic() - t0
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.monotonic()
        pool = ActorPool(lambda: GpuRunner.remote(args.kernel_timeout), 1)
        start_s = time.monotonic() - t0
        model = ray.get(pool.actors[0].gpu_model.remote())
        timeouts = {n: (args.hang_timeout if n.startswith("hang") else 180.0) for n in texts}
        mixed, mixed_wall = run_batch(pool, built, list(texts), shapes, seed=args.seed, reps=args.reps,
                                      timeouts=timeouts)
        replaced_mixed = pool.replaced
        good = [n for n in texts if n.startswith("good")]
        alone, alone_wall = run_batch(pool, built, good, shapes, seed=args.seed, reps=args.reps, timeouts=timeouts)
        pool.shutdown()
    finally:
        ray.shutdown()

    expect = {"good": "measured", "fault": "runtime_fault", "hang": "timeout", "nan": "wrong"}
    checks, comparisons = [], []
    for n, r in mixed.items():
        want = expect[n.split("_")[0]]
        checks.append({"candidate": n, "expected": want, "got": r["outcome"], "ok": r["outcome"] == want,
                       "message": r["message"][:240]})
    for n in good:
        if mixed[n]["outcome"] != "measured" or alone[n]["outcome"] != "measured":
            comparisons.append({"candidate": n, "shape": "-", "ok": False})
            continue
        for ra, rb in zip(mixed[n]["runs"], alone[n]["runs"]):
            comparisons.append({"candidate": n, "shape": ra["shape"], "mixed_ms": ra["median_ms"],
                                "mixed_p10": ra["p10_ms"], "mixed_p90": ra["p90_ms"], "alone_ms": rb["median_ms"],
                                "alone_p10": rb["p10_ms"], "alone_p90": rb["p90_ms"],
                                "diff_pct": 100 * (ra["median_ms"] - rb["median_ms"]) / rb["median_ms"],
                                "ok": agree(ra, rb)})
    summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": f"{model}; "
               f"{platform.node()}", "command": " ".join(sys.argv), "shapes": shapes, "reps": args.reps,
               "hang_timeout_s": args.hang_timeout, "kernel_timeout_s": args.kernel_timeout,
               "build_s": round(build_s, 1), "pool_start_s": round(start_s, 1),
               "mixed_wall_s": round(mixed_wall, 1), "alone_wall_s": round(alone_wall, 1),
               "actors_replaced_in_mixed_batch": replaced_mixed, "actors_replaced_total": pool.replaced,
               "checks": checks, "comparisons": comparisons, "mixed": mixed, "alone": alone}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_isolation.json").write_text(json.dumps(summary, indent=2, default=str))

    print(f"\nisolation on {model}: mixed batch {mixed_wall:.1f} s ({replaced_mixed} actors replaced), "
          f"good-only batch {alone_wall:.1f} s")
    print(f"{'candidate':<24}{'expected':<15}{'got':<15}{'pid':>8}  message")
    for c in checks:
        print(f"{c['candidate']:<24}{c['expected']:<15}{c['got']:<15}{'':>8}  "
              f"{'OK ' if c['ok'] else 'BAD'} {c['message'][:110]}")
    print(f"{'good candidate':<16}{'shape':<20}{'mixed ms':>10}{'p10..p90':>18}{'alone ms':>10}{'p10..p90':>18}"
          f"{'diff':>8}")
    for c in comparisons:
        if "mixed_ms" not in c:
            print(f"{c['candidate']:<16}{'not measured in both batches':<40}  BAD")
            continue
        print(f"{c['candidate']:<16}{c['shape']:<20}{c['mixed_ms']:>10.4f}{c['mixed_p10']:>9.4f}..{c['mixed_p90']:<7.4f}"
              f"{c['alone_ms']:>10.4f}{c['alone_p10']:>9.4f}..{c['alone_p90']:<7.4f}{c['diff_pct']:>+7.1f}%"
              f"  {'OK' if c['ok'] else 'BAD'}")
    ok = all(c["ok"] for c in checks) and all(c["ok"] for c in comparisons)
    print("isolation: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
