#!/usr/bin/env python3
"""Check and time the warp-specialized Hopper GEMM seed (gemm_bf16_ws.cake) against cuBLAS, on the H200.

Run on the GPU machine (its python3 has cupy, cuda-bindings, torch):

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python3 bench/gpu_ws_gemm.py

Phases, each in this one process:
1. build: lower + nvcc (sm_90a), registers / spills from ptxas, HGMMA / UTMALDG counted in the SASS.
2. probes: structured inputs on one CTA (identity x index-coded operands, then random with the ring
   wrapping), launched through the runtime's launcher; a mismatch prints the corner of the tile and
   saves everything to $OUT/probes.npz (layout bugs show up as permutations there).
3. gate: cake_core.runtime.gpu.check_and_time (fp64 CPU oracle, poisoned outputs, perturbation) on
   ragged shapes, and an unaligned K that must be refused before launch.
4. timing: the ws kernel and torch.matmul (cuBLAS, bf16 out; and fp32 out where torch offers it) on one
   stream, CUDA events around each launch, a 256 MiB L2 flush before every timed launch, median of 30
   after 5 warm-ups; every ws output checked against an fp32 cuBLAS product first. 1024/2048 are also
   timed through check_and_time, to show the two harnesses agree.
Writes $OUT/gpu_ws_gemm.json (and probes.npz); prints a short table last.
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

OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="ws-gemm-"))
SEED = ROOT / "cake_core/problems/seeds/gemm_bf16_ws.cake"
GEMM = get_problem("gemm_bf16")
GATE = [{"M": 128, "N": 64, "K": 64}, {"M": 64, "N": 8, "K": 8}, {"M": 200, "N": 72, "K": 136},
        {"M": 129, "N": 136, "K": 520}, {"M": 1000, "N": 1000, "K": 1000}, {"M": 2047, "N": 1032, "K": 520},
        {"M": 333, "N": 512, "K": 1288}]
TIMED = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
         (1000, 1000, 1000), (4168, 4104, 4104), (3000, 5000, 2056)]
REPS, WARMUP = 30, 5
PREDICTED_FRACTION_4096 = 0.4     # written down before the first run: see bench/results/gpu-ws-gemm-*.md


def log(*a):
    print(*a, flush=True)


def build():
    lk = lower(parse_program(SEED.read_text(), SEED.name), SEED.name).value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=Path(tempfile.mkdtemp(prefix="cake-cubin-")))
    assert cr.ok, [d.message for d in cr.diagnostics]
    c = cr.value
    info = {"registers": c.resources.registers, "spill_bytes": c.resources.spill_bytes,
            "smem_bytes": lk.smem_bytes, "threads": lk.threads}
    tool = shutil.which("cuobjdump")
    if tool:
        sass = subprocess.run([tool, "-sass", str(c.cubin_path)], capture_output=True, text=True).stdout
        info |= {"HGMMA": sass.count("HGMMA"), "UTMALDG": sass.count("UTMALDG"), "LDL/STL": sass.count("LDL") + sass.count("STL")}
    log("build:", info)
    return c, lk, info


def probes(cp, fn, lk, stream):
    """One CTA, structured inputs. Returns {name: (ok, max_abs_err)}."""
    res, saved = {}, {}
    M, N = 128, 64
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
    np.savez_compressed(OUT / "probes.npz", **saved)
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
        grid = lk.grid_for(shape)

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


def main():
    import cupy as cp
    if len(sys.argv) > 2 and sys.argv[1] == "--timing-only":   # e.g. --timing-only 4096x4096x4104,4160x4160x4160
        global TIMED
        TIMED = [tuple(int(x) for x in s.split("x")) for s in sys.argv[2].split(",")]
        compiled, lk, _ = build()
        rows = timing(compiled, lk)
        (OUT / "gpu_ws_gemm_timing_only.json").write_text(json.dumps(rows, indent=1))
        for r in rows:
            log(f"{r['M']}x{r['N']}x{r['K']}: ws {r.get('ws_ms', float('nan')):.3f} ms {r.get('ws_tflops', 0):.0f} TF/s, "
                f"cuBLAS {r['cublas_ms']:.3f} ms {r['cublas_tflops']:.0f} TF/s, ratio {r.get('fraction_of_cublas', 0):.2f}, "
                f"correct {r['ws_correct']}")
        return 0
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpu.gpu_model(), "seed": SEED.name,
              "reps": REPS, "warmup": WARMUP, "predicted_fraction_of_cublas_4096": PREDICTED_FRACTION_4096}
    try:
        import torch
        report["torch"], report["cupy"] = torch.__version__, cp.__version__
    except Exception:  # noqa: BLE001
        pass
    compiled, lk, report["build"] = build()
    stream = cp.cuda.Stream(non_blocking=True)
    fn = cp.RawModule(path=str(compiled.cubin_path)).get_function(compiled.kernel_name)
    fn.max_dynamic_shared_size_bytes = lk.smem_bytes
    with stream:
        report["probes"], dead = probes(cp, fn, lk, stream)
    if dead:
        (OUT / "gpu_ws_gemm.json").write_text(json.dumps(report, indent=1, default=str))
        log("a probe faulted or hung: stopping (the context is unusable)")
        return 1
    report["gate"], report["unaligned_k"] = gate(compiled, lk)
    if not all(g["outcome"] == "checked" for g in report["gate"]):
        log("gate failed: timing anyway for information, but the kernel is WRONG")
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
    (OUT / "gpu_ws_gemm.json").write_text(json.dumps(report, indent=1, default=str))

    log("\n=== ws GEMM seed vs cuBLAS (torch.matmul bf16), H200, median of", REPS, "cold-L2 launches ===")
    log(f"{'M x N x K':>20} {'ws ms':>8} {'ws TF/s':>8} {'cuBLAS ms':>9} {'cuBLAS TF/s':>11} {'ws/cuBLAS':>9} "
        f"{'f32out TF/s':>11} {'rel err':>8}")
    for r in report["timing"]:
        f32 = r.get("cublas_f32out_tflops")
        log(f"{r['M']:>6}x{r['N']:>6}x{r['K']:>6} {r.get('ws_ms', float('nan')):8.3f} {r.get('ws_tflops', float('nan')):8.1f} "
            f"{r['cublas_ms']:9.3f} {r['cublas_tflops']:11.1f} {r.get('fraction_of_cublas', float('nan')):9.2f} "
            f"{(f32 if f32 else float('nan')):11.1f} {r['ws_rel_err']:8.1e}{'' if r['ws_correct'] else ' WRONG'}")
    log("gate:", sum(g["outcome"] == "checked" for g in report["gate"]), "/", len(report["gate"]), "shapes correct;",
        "unaligned K refused" if "K % 8" in report["unaligned_k"] else "unaligned K NOT refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
