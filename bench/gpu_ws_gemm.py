#!/usr/bin/env python3
"""Check and time the warp-specialized Hopper GEMM seeds (gemm_bf16_ws*.cake) against cuBLAS, on the H200.

Run on the GPU machine (its python3 has cupy, cuda-bindings, torch):

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python3 bench/gpu_ws_gemm.py [--variants n64,n256,...] [--out DIR]

Every variant (VARIANTS: a seed file plus text substitutions, e.g. BN=128 or wgmma_wait(0) instead of 1)
runs in its own subprocess (`--one NAME`), so that a variant that faults or hangs cannot take the others
down with it. Phases of one variant, each in that process:
1. build: lower + nvcc (sm_90a), registers / spills / C75xx remarks from ptxas, HGMMA / UTMALDG counted in
   the SASS.
2. probes: structured inputs on one CTA (identity x index-coded operands, then random with the ring
   wrapping), launched through the runtime's launcher; a mismatch prints the corner of the tile and
   saves everything to $OUT/probes_NAME.npz (layout bugs show up as permutations there).
3. gate: cake_core.runtime.gpu.check_and_time (fp64 CPU oracle, poisoned outputs, perturbation) on
   ragged shapes, and an unaligned K that must be refused before launch.
4. timing: the ws kernel and torch.matmul (cuBLAS, bf16 out; and fp32 out where torch offers it) on one
   stream, CUDA events around each launch, a 256 MiB L2 flush (write) before every timed launch, median of 30
   after 5 warm-ups; every ws output checked against an fp32 cuBLAS product first. A wrong variant is
   not timed.
Writes $OUT/gpu_ws_gemm_NAME.json per variant and $OUT/gpu_ws_gemm.json (all); prints a table last.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402
from cake_core.runtime import gpu, tma  # noqa: E402
from cake_core.problems import corpus_file  # noqa: E402

OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="ws-gemm-"))
SEED = corpus_file("gemm_bf16_ws.cake")
N256 = corpus_file("gemm_bf16_ws_n256.cake")
PERSISTENT = corpus_file("gemm_bf16_persistent.cake")
_WAIT1 = "wgmma_wait(1)\n            if kt > 0:\n                arrive(empty[(kt + S - 1) % S])"
_WAIT0 = "wgmma_wait(0)\n            arrive(empty[kt % S])"
# name -> (seed file, ((old, new), ...)): each variant is the seed's text with these substitutions
VARIANTS = {
    "n64": (SEED, ()),                                                    # the first seed: m64n64, wait(0)
    "n256": (N256, ()),                                                   # m64n256, wait(1), grouped raster G=16
    "n256_rowmajor": (N256, (('"G": 16', '"G": 1'),)),                    # raster off (G=1: row-major tiles)
    "n256_g8": (N256, (('"G": 16', '"G": 8'),)),
    "n256_wait0": (N256, ((_WAIT1, _WAIT0),)),                            # no wgmma overlap across k-tiles
    "n128": (N256, (('"BN": 256', '"BN": 128'),)),                        # m64n128
    "persistent": (PERSISTENT, ()),                                       # n256, grid = min(tiles, num_sms)
    "persistent_g8": (PERSISTENT, (('"G": 16', '"G": 8'),)),
    "persistent_mc": (corpus_file("gemm_bf16_persistent_mc.cake"), ()),      # 2-CTA clusters, B multicast
}
GEMM = get_problem("gemm_bf16")
GATE = [{"M": 128, "N": 64, "K": 64}, {"M": 64, "N": 8, "K": 8}, {"M": 200, "N": 72, "K": 136},
        {"M": 129, "N": 136, "K": 520}, {"M": 1000, "N": 1000, "K": 1000}, {"M": 2047, "N": 1032, "K": 520},
        {"M": 333, "N": 512, "K": 1288}, {"M": 129, "N": 264, "K": 520}, {"M": 2100, "N": 520, "K": 72}]
TIMED = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
         (1000, 1000, 1000), (4168, 4104, 4104), (3000, 5000, 2056)]
REPS, WARMUP = 30, 5


def log(*a):
    print(*a, flush=True)


def variant_text(name: str) -> tuple[str, str]:
    path, subs = VARIANTS[name]
    text = path.read_text()
    for old, new in subs:
        assert old in text, (name, old)
        text = text.replace(old, new)
    return text, path.name


def build(name: str = "n64"):
    text, fname = variant_text(name)
    r = lower(parse_program(text, fname), fname)
    assert r.ok, [d.message for d in r.diagnostics]
    lk = r.value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=Path(tempfile.mkdtemp(prefix="cake-cubin-")))
    assert cr.ok, [d.message for d in cr.diagnostics]
    c = cr.value
    remarks = [ln.strip() for ln in cr.artifacts.get("nvcc.log", "").splitlines() if "(C75" in ln]
    info = {"variant": name, "registers": c.resources.registers, "spill_bytes": c.resources.spill_bytes,
            "smem_bytes": lk.smem_bytes, "threads": lk.threads, "ptxas_remarks": remarks,
            "consts": {k: v for k, v in lk.consts}}
    tool = shutil.which("cuobjdump")
    if tool:
        sass = subprocess.run([tool, "-sass", str(c.cubin_path)], capture_output=True, text=True).stdout
        info |= {"HGMMA": sass.count("HGMMA"), "UTMALDG": sass.count("UTMALDG"), "LDL/STL": sass.count("LDL") + sass.count("STL")}
    log("build:", info)
    return c, lk, info


def probes(cp, fn, lk, stream, tag="n64"):
    """One CTA, structured inputs. Returns {name: (ok, max_abs_err)}."""
    res, saved = {}, {}
    M, N = 128, dict(lk.consts).get("BN", 64)
    eye = lambda r, c: (np.arange(r)[:, None] % c == np.arange(c)[None, :]).astype(np.float32)  # noqa: E731
    rng = np.random.default_rng(0)
    cases = {
        "I_x_Bk": (eye(M, 64), np.repeat(np.arange(64, dtype=np.float32)[:, None], N, 1)),        # C[i,n] = i % 64
        "I_x_Bn": (eye(M, 64), np.repeat(np.arange(N, dtype=np.float32)[None, :], 64, 0)),        # C[i,n] = n
        "Ai_x_I": (np.repeat(np.arange(M, dtype=np.float32)[:, None], 64, 1) / 64, eye(64, N)),   # C[i,n] = i / 64
        "Ak_x_I": (np.repeat(np.arange(64, dtype=np.float32)[None, :], M, 0), eye(64, N)),        # C[i,n] = n
        "rand_K64": (rng.integers(-3, 4, (M, 64)).astype(np.float32), rng.integers(-3, 4, (64, N)).astype(np.float32)),
        "rand_K640": (rng.integers(-3, 4, (M, 640)).astype(np.float32), rng.integers(-3, 4, (640, N)).astype(np.float32)),
    }
    for name, (a, b) in cases.items():
        shape = {"M": M, "N": N, "K": a.shape[1]}
        L = gpu._Launcher(cp, fn, lk, GEMM, shape, stream, 10.0)
        try:
            got = L.run_checked(L.upload({"a": a, "b": b}), f"probe {name}")["c"]
        except Exception as e:  # noqa: BLE001
            res[name] = (False, f"{type(e).__name__}: {e}")
            log(f"probe {name}: FAILED TO RUN: {e}")
            return res, True
        want = a.astype(np.float64) @ b.astype(np.float64)
        err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).all() else float("inf")
        ok = err < 1e-3
        res[name] = (ok, err)
        saved[name + "_got"], saved[name + "_want"] = got, want
        log(f"probe {name}: {'ok' if ok else 'MISMATCH'} max abs err {err:.3g}")
        if not ok:
            np.set_printoptions(linewidth=200, precision=2, suppress=True)
            log("  got[0:8, 0:10]\n", got[:8, :10], "\n  want[0:8, 0:10]\n", want[:8, :10])
            log("  got[64:68, 0:10]\n", got[64:68, :10])
            log("  got[0:4, 60:68]\n", got[:4, 60:68], "\n  want[0:4, 60:68]\n", want[:4, 60:68])
    np.savez_compressed(OUT / f"probes_{tag}.npz", **saved)
    return res, False


def gate(compiled, lk):
    runs = gpu.check_and_time(compiled, lk, GEMM, GATE, seed=11, time=False, timeout_s=10)
    for r in runs:
        log(f"gate {r.shape}: {r.outcome} err {r.max_error:.2e} {'' if r.correct else r.message}")
    try:
        gpu.check_and_time(compiled, lk, GEMM, [{"M": 128, "N": 64, "K": 100}], seed=0, time=False)
        refused = "NOT REFUSED"
    except gpu.GPURefused as e:
        refused = str(e)
    log("unaligned K=100:", refused)
    return [{"shape": r.shape, "outcome": r.outcome, "max_error": r.max_error, "message": r.message} for r in runs], refused


def timing(compiled, lk):
    import cupy as cp
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    ts = torch.cuda.current_stream()
    cstream = cp.cuda.ExternalStream(ts.cuda_stream)  # (Stream.from_external in newer CuPy)
    fn = cp.RawModule(path=str(compiled.cubin_path)).get_function(compiled.kernel_name)
    fn.max_dynamic_shared_size_bytes = lk.smem_bytes
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def med(launch):
        for _ in range(WARMUP):
            launch()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
        for s, e in ev:
            flush.zero_()
            s.record(ts)
            launch()
            e.record(ts)
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in ev)
        return float(np.median(ms)), float(ms[len(ms) // 10]), float(ms[-(len(ms) // 10) - 1])

    rows = []
    for (M, N, K) in TIMED:
        shape = {"M": M, "N": N, "K": K}
        g = torch.Generator(device=dev).manual_seed(M * 7 + N * 3 + K)
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16, generator=g)
        c = torch.empty(M, N, device=dev, dtype=torch.float32)
        ca, cb, cc = cp.asarray(a.view(torch.int16)), cp.asarray(b.view(torch.int16)), cp.asarray(c)
        arrays = {"a": ca, "b": cb, "c": cc}
        args = tuple(arrays[p.name] for p in lk.params) + tuple(np.int32(shape[d]) for d in lk.dims) \
            + tuple(tma.encode_tensor_maps(lk, arrays, shape))
        grid = lk.grid_for(shape, num_sms=gpu._num_sms(cp))

        def ws():
            with cstream:
                fn(grid, (lk.threads, 1, 1), args, shared_mem=lk.smem_bytes)

        c.fill_(float("nan"))
        ws()
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = float((c - ref).abs().max() / ref.abs().max())
        ok = bool(torch.isfinite(c).all()) and err < GEMM.rtol
        row = {"M": M, "N": N, "K": K, "ws_correct": ok, "ws_rel_err": err, "grid": list(grid)}
        if ok:
            row["ws_ms"], row["ws_p10_ms"], row["ws_p90_ms"] = med(ws)
            row["ws_recheck_after_timing"] = float((c - ref).abs().max() / ref.abs().max())   # last timed output
        row["cublas_ms"], row["cublas_p10_ms"], row["cublas_p90_ms"] = med(lambda: torch.matmul(a, b))
        try:
            torch.mm(a, b, out_dtype=torch.float32)
            row["cublas_f32out_ms"] = med(lambda: torch.mm(a, b, out_dtype=torch.float32))[0]
        except Exception as e:  # noqa: BLE001 - older torch: no out_dtype
            row["cublas_f32out_ms"] = None
            row["cublas_f32out_note"] = str(e)[:120]
        fl = 2.0 * M * N * K
        for k in ("ws", "cublas", "cublas_f32out"):
            if row.get(f"{k}_ms"):
                row[f"{k}_tflops"] = fl / row[f"{k}_ms"] / 1e9
        if row.get("ws_ms"):
            row["fraction_of_cublas"] = row["cublas_ms"] / row["ws_ms"]
        log("timed", json.dumps(row))
        rows.append(row)
        del a, b, c, ref, ca, cb, cc, arrays, args
        torch.cuda.empty_cache()
    return rows


def runtime_timing(compiled, lk):
    out = []
    for n in (1024, 2048):
        (r,) = gpu.check_and_time(compiled, lk, GEMM, [{"M": n, "N": n, "K": n}], seed=5, reps=30, warmup=5, timeout_s=20)
        out.append({"n": n, "outcome": r.outcome, "median_ms": r.median_ms, "p10_ms": r.p10_ms, "p90_ms": r.p90_ms,
                    "max_error": r.max_error})
        log("runtime check_and_time", out[-1])
    return out


DEFAULT_VARIANTS = ("n64", "n256", "n256_rowmajor", "n256_wait0", "n128")


def run_one(name: str, with_runtime_timing: bool) -> dict:
    """Every phase for one variant, in this process; writes $OUT/gpu_ws_gemm_NAME.json."""
    import cupy as cp
    report = {"variant": name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpu.gpu_model(),
              "seed": VARIANTS[name][0].name, "substitutions": VARIANTS[name][1], "reps": REPS, "warmup": WARMUP}
    path = OUT / f"gpu_ws_gemm_{name}.json"
    try:
        import torch
        report["torch"], report["cupy"] = torch.__version__, cp.__version__
    except Exception:  # noqa: BLE001
        pass
    compiled, lk, report["build"] = build(name)
    stream = cp.cuda.Stream(non_blocking=True)
    fn = cp.RawModule(path=str(compiled.cubin_path)).get_function(compiled.kernel_name)
    fn.max_dynamic_shared_size_bytes = lk.smem_bytes
    with stream:
        report["probes"], dead = probes(cp, fn, lk, stream, name)
    if dead:
        path.write_text(json.dumps(report, indent=1, default=str))
        log(f"[{name}] a probe faulted or hung: stopping (the context is unusable)")
        return report
    report["gate"], report["unaligned_k"] = gate(compiled, lk)
    report["correct"] = all(ok for ok, _ in report["probes"].values()) and \
        all(g["outcome"] == "checked" for g in report["gate"])
    if not report["correct"]:
        log(f"[{name}] WRONG (probes or gate): not timed")
        path.write_text(json.dumps(report, indent=1, default=str))
        return report
    if with_runtime_timing:
        try:
            report["runtime_timing"] = runtime_timing(compiled, lk)
        except Exception as e:  # noqa: BLE001
            report["runtime_timing_error"] = traceback.format_exc()
            log("runtime timing failed:", e)
    try:
        report["timing"] = timing(compiled, lk)
    except Exception:  # noqa: BLE001
        report["timing"] = []
        report["timing_error"] = traceback.format_exc()
        log(report["timing_error"])
    path.write_text(json.dumps(report, indent=1, default=str))
    return report


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    ap.add_argument("--one", help="run one variant in this process (what the parent spawns)")
    ap.add_argument("--runtime-timing", action="store_true", help="with --one: time 1024/2048 via check_and_time too")
    ap.add_argument("--timing-only", help="shapes MxNxK,... : timing only, no probes / gate")
    ap.add_argument("--out", help="output folder (default $OUT)")
    ap.add_argument("--child-timeout", type=float, default=60.0)
    args = ap.parse_args()
    global OUT, TIMED
    if args.out:
        OUT = Path(args.out)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.timing_only:
        TIMED = [tuple(int(x) for x in t.split("x")) for t in args.timing_only.split(",")]
    if args.one:
        if args.timing_only:
            compiled, lk, _ = build(args.one)
            rows = timing(compiled, lk)
            (OUT / f"gpu_ws_gemm_{args.one}_timing_only.json").write_text(json.dumps(rows, indent=1))
            return 0
        run_one(args.one, args.runtime_timing)
        return 0

    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}")
    reports = {}
    for k, name in enumerate(names):
        cmd = [sys.executable, __file__, "--one", name, "--out", str(OUT)]
        if args.timing_only:
            cmd += ["--timing-only", args.timing_only]
        elif k == 0:
            cmd.append("--runtime-timing")
        t0 = time.time()
        try:
            rc = subprocess.run(cmd, timeout=args.child_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"[{name}] exit {rc} after {time.time() - t0:.1f} s")
        f = OUT / (f"gpu_ws_gemm_{name}_timing_only.json" if args.timing_only else f"gpu_ws_gemm_{name}.json")
        if f.exists():
            rep = json.loads(f.read_text())
            reports[name] = {"timing": rep} if args.timing_only else rep
        else:
            reports[name] = {"variant": name, "error": f"no report (exit {rc})", "timing": []}
    (OUT / "gpu_ws_gemm.json").write_text(json.dumps(reports, indent=1, default=str))

    log(f"\n=== ws GEMM variants vs cuBLAS (torch.matmul bf16 out), {gpu.gpu_model()}, median of {REPS} "
        "cold-L2 launches; ratio = cuBLAS ms / variant ms (same process) ===")
    for name, rep in reports.items():
        b = rep.get("build", {})
        log(f"[{name}] regs {b.get('registers')} smem {b.get('smem_bytes')} HGMMA {b.get('HGMMA')} "
            f"UTMALDG {b.get('UTMALDG')} LDL/STL {b.get('LDL/STL')} remarks {b.get('ptxas_remarks')} "
            f"probes {'ok' if all(v[0] for v in rep.get('probes', {}).values()) and rep.get('probes') else rep.get('probes')} "
            f"gate {sum(g['outcome'] == 'checked' for g in rep.get('gate', []))}/{len(rep.get('gate', []))}"
            + (f" ERROR {rep['error']}" if "error" in rep else ""))
    shapes = [(r["M"], r["N"], r["K"]) for r in next((rep["timing"] for rep in reports.values() if rep.get("timing")), [])]
    log(f"{'M x N x K':>20} {'cuBLAS ms':>9} {'TF/s':>6} " + " ".join(f"{n[:14]:>22}" for n in reports))
    for shp in shapes:
        cells, cub = [], None
        for name, rep in reports.items():
            r = next((r for r in rep.get("timing", []) if (r["M"], r["N"], r["K"]) == shp), None)
            if r is None or not r.get("ws_ms"):
                cells.append(f"{'-' if r is None else 'WRONG':>22}")
                continue
            cub = cub or r
            cells.append(f"{r['ws_ms']:7.3f} {r['ws_tflops']:5.0f} {r['fraction_of_cublas']:5.2f}x".rjust(22))
        log(f"{shp[0]:>6}x{shp[1]:>6}x{shp[2]:>6} {cub['cublas_ms'] if cub else float('nan'):9.3f} "
            f"{cub['cublas_tflops'] if cub else float('nan'):6.0f} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
