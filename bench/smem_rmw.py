"""How fast one SM adds rows into a shared-memory accumulator, against the warps it holds.

The two lowerings of ``scatter_add`` into a whole smem tile (``cake::scatter_add_smem``: shared-memory
atomics; ``cake::scatter_add_smem_owned``: plain adds by the warp owning each target row) are chains of
dependent shared-memory reads and writes. Whether they run at the SM's shared-memory rate or at the rate
their latency allows depends on how many such chains the SM holds: its resident warps. The cost model's
rate for them (``smem_rmw`` in ``cake_core/targets/gpus/*.json``: ``per_clk * n / (n + half_warps)``
elements per clock per SM with ``n`` resident warps, ``Gpu.smem_rmw_ops_per_s``) is this probe's fit, not
fitted on the kernels the model grades.

    python bench/smem_rmw.py --out smem-rmw.json      # on the GPU machine (nvcc, a GPU)

Compiles the project's own device header with a probe kernel: every CTA adds the same (R x 32) bf16 tile,
its rows sent to uniform random rows of a (K x 32) f32 accumulator, ITERS times with a barrier between calls,
as the kmeans_update kernels do per pipeline stage. One wave of ``SMs * ctas_per_sm`` CTAs. For each
lowering, THREADS in 128..1024, R in {128, 384} and 1 or 2 CTAs per SM it reports the median over CTAs of
the cycles (``clock64``) per call, and the elements added per clock per SM. The accumulators are checked
against the host's sum (a wrong probe prints nothing). Prints a table and the fit per lowering (least
squares of ``1 / rate`` on ``1 / n``: intercept ``1 / per_clk``, slope ``half_warps / per_clk``) and writes
JSON. ``--fit FILE`` prints the fit of a result file written before.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from cuda_probe import ProbeFailed, run_probe

HEADER = Path(__file__).resolve().parents[1] / "cake_core" / "lower" / "header"
ITERS = 64
CONFIGS = [(owned, threads, r, per_sm) for owned in (0, 1) for per_sm in (1, 2) for r in (128, 384)
           for threads in (128, 256, 512, 1024)]

PROBE = r"""
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "cake.cuh"

constexpr int C = 32, ITERS = %(iters)d;

template <int THREADS, int R, bool OWNED>
__global__ void __launch_bounds__(THREADS) probe(const int* idx_g, const float* src_g, int krows, float* acc_g,
                                                 long long* cycles) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* acc = reinterpret_cast<float*>(smem);
    int* idx = reinterpret_cast<int*>(acc + krows * C);
    __nv_bfloat16* src = reinterpret_cast<__nv_bfloat16*>(idx + R);
    for (int e = threadIdx.x; e < krows * C; e += THREADS) acc[e] = 0.0f;
    for (int e = threadIdx.x; e < R; e += THREADS) idx[e] = idx_g[blockIdx.x * R + e];
    for (int e = threadIdx.x; e < R * C; e += THREADS) src[e] = __float2bfloat16_rn(src_g[e]);
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < ITERS; ++it) {
        if constexpr (OWNED) cake::scatter_add_smem_owned<R, C, THREADS, false>(acc, krows, idx, src, R);
        else cake::scatter_add_smem<R, C, THREADS, false>(acc, krows, idx, src, R);
        __syncthreads();
    }
    const long long t1 = clock64();
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
    for (int e = threadIdx.x; e < krows * C; e += THREADS) acc_g[(size_t)blockIdx.x * krows * C + e] = acc[e];
}

template <int THREADS, int R, bool OWNED>
int run(const cudaDeviceProp& p, int per_sm, bool first) {
    const int krows = per_sm == 1 ? 1024 : 512, ctas = p.multiProcessorCount * per_sm;
    const size_t smem = (size_t)krows * C * 4 + R * 4 + (size_t)R * C * 2;
    auto k = probe<THREADS, R, OWNED>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) return 1;
    int fit = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, THREADS, smem);
    std::vector<int> idx((size_t)ctas * R);
    std::vector<float> src((size_t)R * C);
    unsigned s = 12345u + THREADS * 7 + R * 131 + per_sm * 17 + OWNED;
    for (auto& i : idx) { s = s * 1664525u + 1013904223u; i = (int)((s >> 8) %% (unsigned)krows); }
    for (auto& v : src) { s = s * 1664525u + 1013904223u; v = (float)((s >> 12) %% 16u) / 8.0f + 0.125f; }
    int* d_idx; float *d_src, *d_acc; long long* d_cyc;
    cudaMalloc(&d_idx, idx.size() * 4); cudaMalloc(&d_src, src.size() * 4);
    cudaMalloc(&d_acc, (size_t)ctas * krows * C * 4); cudaMalloc(&d_cyc, ctas * 8);
    cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_src, src.data(), src.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(d_acc, 0xff, (size_t)ctas * krows * C * 4);       // poisoned: every element must be written
    std::vector<double> per_call;
    std::vector<long long> cyc(ctas);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float ms_runs[5];
    for (int rep = 0; rep < 6; ++rep) {
        cudaEventRecord(a);
        k<<<ctas, THREADS, smem>>>(d_idx, d_src, krows, d_acc, d_cyc);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        if (rep) cudaEventElapsedTime(&ms_runs[rep - 1], a, b);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { fprintf(stderr, "probe failed: %%s\n", cudaGetErrorString(e)); return 2; }
    cudaMemcpy(cyc.data(), d_cyc, ctas * 8, cudaMemcpyDeviceToHost);
    std::vector<float> acc((size_t)krows * C);
    double worst = 0.0;
    for (int cta : {0, ctas - 1}) {                   // the first and the last CTA against the host's sum
        cudaMemcpy(acc.data(), d_acc + (size_t)cta * krows * C, acc.size() * 4, cudaMemcpyDeviceToHost);
        std::vector<double> want((size_t)krows * C, 0.0);
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) want[(size_t)idx[(size_t)cta * R + r] * C + c] += ITERS * src[r * C + c];
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(acc[i] - want[i]));
    }
    if (worst > 1e-3) { fprintf(stderr, "probe wrong: max error %%g\n", worst); return 3; }
    std::sort(cyc.begin(), cyc.end());
    std::sort(ms_runs, ms_runs + 5);
    const double cycles = (double)cyc[ctas / 2] / ITERS;
    printf("%%s{\"lowering\": \"%%s\", \"threads\": %%d, \"rows\": %%d, \"ctas_per_sm\": %%d, \"ctas_per_sm_fit\": %%d, "
           "\"acc_rows\": %%d, \"cycles_per_call\": %%.1f, \"elems_per_clk_per_sm\": %%.3f, \"ms\": %%.5f}",
           first ? "" : ", ", OWNED ? "owned" : "atomic", THREADS, R, per_sm, fit, krows, cycles,
           per_sm * (double)R * C / cycles, ms_runs[2]);
    cudaFree(d_idx); cudaFree(d_src); cudaFree(d_acc); cudaFree(d_cyc);
    return 0;
}

int main() {
    cudaDeviceProp p;
    cudaError_t pe = cudaGetDeviceProperties(&p, 0);
    if (pe != cudaSuccess) { fprintf(stderr, "no usable GPU: %%s\n", cudaGetErrorString(pe)); return 1; }
    printf("{\"device\": \"%%s\", \"sms\": %%d, \"iters\": %%d, \"rows\": [", p.name, p.multiProcessorCount, ITERS);
    bool first = true;
    int rc = 0;
%(calls)s
    printf("]}\n");
    return rc;
}
"""


def source() -> str:
    calls = "\n".join(f"    if (!rc) rc = run<{t}, {r}, {'true' if o else 'false'}>(p, {k}, first); first = false;"
                      for o, t, r, k in CONFIGS)
    return PROBE % {"iters": ITERS, "calls": calls}


def resident_warps(row: dict) -> float:
    """Warps one SM held in a probe row: its threads' warps times the CTAs per SM it ran (at most what fit)."""
    return row["threads"] / 32 * min(row["ctas_per_sm"], row["ctas_per_sm_fit"])


def fit(rows: list[dict]) -> list[dict]:
    """Per lowering: ``per_clk`` and ``half_warps`` of ``rate = per_clk * n / (n + half_warps)`` (least squares
    of 1 / rate on 1 / n over its rows) and the RMS of log(fitted / measured rate)."""
    out = []
    for lowering in sorted({r["lowering"] for r in rows}):
        pts = [(1.0 / resident_warps(r), 1.0 / r["elems_per_clk_per_sm"]) for r in rows if r["lowering"] == lowering]
        n = len(pts)
        slope, intercept = (float(c) for c in np.polyfit([x for x, _ in pts], [y for _, y in pts], 1))
        if intercept <= 0 or slope < 0:
            raise ValueError(f"the {lowering} rows do not fit rate = per_clk * n / (n + half_warps) "
                             f"(intercept {intercept:.4g}, slope {slope:.4g})")
        per_clk, half = 1.0 / intercept, slope / intercept
        rms = math.sqrt(sum(math.log((intercept + slope * x) / y) ** 2 for x, y in pts) / n)
        out.append({"lowering": lowering, "per_clk": round(per_clk, 3), "half_warps": round(half, 2),
                    "rms_log_error": round(rms, 3), "rows": n})
    return out


def print_fit(rows: list[dict]) -> list[dict]:
    result = fit(rows)
    print("fit: rate = per_clk * n / (n + half_warps) elements per clock per SM, n resident warps")
    for f in result:
        print(f"{f['lowering']:>8}: per_clk {f['per_clk']:.3f}, half_warps {f['half_warps']:.2f} "
              f"(RMS log error {f['rms_log_error']:.3f} over {f['rows']} rows)")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    ap.add_argument("--arch", default="sm_90a", help="nvcc's -arch for the probe (default sm_90a)")
    ap.add_argument("--compile-only", action="store_true", help="compile the probe and stop (no GPU needed)")
    ap.add_argument("--fit", type=Path, metavar="FILE", help="print the fit of a result file and stop")
    args = ap.parse_args(argv)
    if args.fit:
        try:
            rows = json.loads(args.fit.read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"smem_rmw: {args.fit} is not a result file of this probe ({e})", file=sys.stderr)
            return 1
        print_fit(rows)
        return 0
    try:
        data = run_probe("smem_rmw", source(), arch=args.arch, flags=("-std=c++17", "-O3", f"-I{HEADER}"),
                         compile_only=args.compile_only, timeout_s=300)
    except ProbeFailed as e:
        print(e, file=sys.stderr)
        return 1
    if data is None:
        print("smem_rmw: the probe compiles")
        return 0
    print(f"{data['device']}: {data['sms']} SMs, {data['iters']} calls per launch")
    print("lowering | threads | rows | CTAs/SM (fit) | cycles per call | elements per clock per SM")
    for row in data["rows"]:
        print(f"{row['lowering']:>8} | {row['threads']:>7} | {row['rows']:>4} | {row['ctas_per_sm']} "
              f"({row['ctas_per_sm_fit']}) | {row['cycles_per_call']:>15.1f} | {row['elems_per_clk_per_sm']:.2f}")
    data["fit"] = print_fit(data["rows"])
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
