"""What one launch that only reads W bytes takes on this GPU, under the corpus timing protocol.

    PYTHONPATH=. python3 bench/read_floor.py [--mib 8,32,128,512] [--reps 30] [--out DIR]

The weight-read floor of a decode GEMM (tinygemm) is bytes / peak bandwidth: 7.8 µs for the 32 MiB of a
4096x4096 bf16 weight at 4.3 TB/s. A real launch also pays the launch itself, the ramp until enough loads
are in flight, and the tail. This script measures that: a plain streaming read (16-byte ``ld.global.nc``
loads, U of them in flight per thread, an xor kept so no load is dropped) of each size, over a grid of
launch shapes, timed exactly as ``cake_core.runtime.gpu`` times a kernel (CUDA events around the launch,
the 256 MiB read flush before it, inputs rotated among 4 copies under 64 MiB, median of ``reps``). An
empty kernel gives the protocol's own fixed cost. Prints a table (best launch shape per size, and the
empty launch) and writes read_floor.json under --out.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.runtime.gpu import L2Flush, MAX_COPIES, ROTATE_BELOW_BYTES, gpu_model  # noqa: E402

_SRC = r"""
template <int U>
__device__ __forceinline__ void read_stream(const int4* __restrict__ p, unsigned long long n, int* sink) {
    int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        int4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const int4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7eadbeef) *sink = acc;   // random data: almost never taken, but keeps every load
}
extern "C" __global__ void read_u1(const int4* p, unsigned long long n, int* s) { read_stream<1>(p, n, s); }
extern "C" __global__ void read_u2(const int4* p, unsigned long long n, int* s) { read_stream<2>(p, n, s); }
extern "C" __global__ void read_u4(const int4* p, unsigned long long n, int* s) { read_stream<4>(p, n, s); }
extern "C" __global__ void read_u8(const int4* p, unsigned long long n, int* s) { read_stream<8>(p, n, s); }
extern "C" __global__ void empty(const int4* p, unsigned long long n, int* s) {}
"""


def _time(cp, fn, grid, block, bufs, n, sink, flush, stream, reps: int, warmup: int) -> list[float]:
    for r in range(warmup):
        fn((grid,), (block,), (bufs[r % len(bufs)], n, sink), stream=stream)
    starts = [cp.cuda.Event() for _ in range(reps)]
    ends = [cp.cuda.Event() for _ in range(reps)]
    for r in range(reps):
        flush(stream)
        starts[r].record(stream)
        fn((grid,), (block,), (bufs[r % len(bufs)], n, sink), stream=stream)
        ends[r].record(stream)
    stream.synchronize()
    return [float(cp.cuda.get_elapsed_time(s, e)) for s, e in zip(starts, ends)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="8,32,128,512", help="sizes to read, MiB")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    try:
        import cupy as cp
        sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    except Exception as e:  # noqa: BLE001 - no CuPy or no GPU: say so, no traceback
        print(f"read_floor: needs a CUDA GPU and CuPy ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    mod = cp.RawModule(code=_SRC, options=("-std=c++17",), name_expressions=None)
    kernels = {u: mod.get_function(f"read_u{u}") for u in (1, 2, 4, 8)}
    empty = mod.get_function("empty")
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flush(cp)
    sink = cp.zeros(1, dtype=np.int32)
    rng = np.random.default_rng(0)
    rows, t0 = [], time.perf_counter()
    with stream:
        ms = _time(cp, empty, 1, 32, [sink], np.uint64(0), sink, flush, stream, args.reps, args.warmup)
        rows.append({"mib": 0, "kernel": "empty", "grid": 1, "block": 32, "median_ms": float(np.median(ms)),
                     "p10_ms": float(np.percentile(ms, 10)), "p90_ms": float(np.percentile(ms, 90))})
        for mib in (int(s) for s in args.mib.split(",") if s):
            nbytes = mib << 20
            host = rng.integers(-2**31, 2**31 - 1, size=nbytes // 4, dtype=np.int64).astype(np.int32)
            bufs = [cp.asarray(host) for _ in range(MAX_COPIES if nbytes < ROTATE_BELOW_BYTES else 1)]
            n = np.uint64(nbytes // 16)
            for (u, fn), per_sm, block in itertools.product(kernels.items(), (1, 2, 4, 8), (256, 512, 1024)):
                if per_sm * block > 2048:
                    continue
                ms = _time(cp, fn, sms * per_sm, block, bufs, n, sink, flush, stream, args.reps, args.warmup)
                med = float(np.median(ms))
                rows.append({"mib": mib, "kernel": f"read_u{u}", "grid": sms * per_sm, "block": block,
                             "median_ms": med, "p10_ms": float(np.percentile(ms, 10)),
                             "p90_ms": float(np.percentile(ms, 90)), "tb_per_s": nbytes / med / 1e9})
            del bufs
    best = {}
    for r in rows:
        if r["mib"] and (r["mib"] not in best or r["median_ms"] < best[r["mib"]]["median_ms"]):
            best[r["mib"]] = r
    result = {"script": "bench/read_floor.py", "gpu": gpu_model(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "protocol": "CUDA events around one launch; 256 MiB read flush before each; buffers rotated among "
                          f"{MAX_COPIES} copies under 64 MiB; median of {args.reps} after {args.warmup} warm-ups",
              "seconds": round(time.perf_counter() - t0, 1), "rows": rows, "best": list(best.values())}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "read_floor.json").write_text(json.dumps(result, indent=1))
    e = rows[0]
    print(f"empty launch: {1e3 * e['median_ms']:.2f} us median (p10 {1e3 * e['p10_ms']:.2f}, "
          f"p90 {1e3 * e['p90_ms']:.2f})")
    print(f"{'MiB':>5} {'best kernel':>12} {'grid':>5} {'block':>5} {'median us':>10} {'TB/s':>6}")
    for mib, r in sorted(best.items()):
        print(f"{mib:>5} {r['kernel']:>12} {r['grid']:>5} {r['block']:>5} {1e3 * r['median_ms']:>10.2f} "
              f"{r['tb_per_s']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
