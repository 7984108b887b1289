"""What one launch that only reads W bytes takes on this GPU, under the corpus timing protocol.

    PYTHONPATH=. python3 bench/read_floor.py [--mib 8,32,128,512] [--reps 30] [--out DIR]

The weight-read floor of a decode GEMM (tinygemm) is bytes / peak bandwidth: 7.8 µs for the 32 MiB of a
4096x4096 bf16 weight at 4.3 TB/s. A real launch also pays the launch itself, the ramp until enough loads
are in flight, and the tail. This script measures that: a plain streaming read (16-byte ``ld.global.nc``
loads, U of them in flight per thread, an xor kept so no load is dropped) of each size, over a grid of
launch shapes, timed exactly as ``cake_core.runtime.gpu`` times a kernel (CUDA events around the launch,
the 256 MiB read flush before it, inputs rotated among 4 copies under 64 MiB, median of ``reps``). An
empty kernel gives the protocol's own fixed cost. Probes split that cost: the event pair alone, the empty
launch after a GPU-side hold (``--hold-us``: the host is surely ahead, so host launch latency is not in
it), 20 back-to-back launches, and the graph timer (``timer="graph"``: a CUDA graph of launches back to
back, each on its own buffer); the best read per size is re-timed after the hold and by the graph timer.
Prints the probes and a table (best launch shape per size, and the empty launch) and writes
read_floor.json under --out.
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

from cake_core.runtime.gpu import L2Flush, capture_graph, gpu_model  # noqa: E402
from cake_core.runtime.timing import (MAX_COPIES, ROTATE_BELOW_BYTES, cupy_clock, graph_launches,  # noqa: E402
                                      time_regions)

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
// W as a square K x K bf16 matrix read the way a 64-column-tile GEMV kernel reads it: CTA c reads the
// band of 2^lb int4 (8 bf16 each) columns c / split, rows [c % split * rows / split, ...): each row of
// a band is one 16 B .. 512 B segment, rows a whole matrix row apart
extern "C" __global__ void read_band(const int4* __restrict__ p, int rows, int lrow, int lb, int split, int* sink) {
    const int c = blockIdx.x, per = rows / split, r0 = (c % split) * per;
    const unsigned long long col0 = (unsigned long long)(c / split) << lb;
    const int total = per << lb, mask = (1 << lb) - 1;
    int acc = 0;
    int i = threadIdx.x;
    for (; i + 3 * (int)blockDim.x < total; i += 4 * blockDim.x) {
        int4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = i + u * blockDim.x;
            v[u] = __ldg(p + ((unsigned long long)(r0 + (idx >> lb)) << lrow) + col0 + (idx & mask));
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < total; i += blockDim.x) {
        const int4 v = __ldg(p + ((unsigned long long)(r0 + (i >> lb)) << lrow) + col0 + (i & mask));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7eadbeef) *sink = acc;
}
extern "C" __global__ void hold(unsigned long long ns) {   // one thread spins ns on the global timer
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def _time(cp, fn, grid, block, bufs, n, sink, flush, stream, reps: int, warmup: int,
          hold=None, launches: int = 1) -> list[float]:
    """ms per launch: ``launches`` back-to-back launches (0: none, the event pair alone) between one pair
    of events after each flush; ``hold`` (a callable) runs between the flush and the start event."""
    for r in range(warmup):
        fn((grid,), (block,), (bufs[r % len(bufs)], n, sink), stream=stream)

    def body(r: int) -> None:
        for j in range(launches):
            fn((grid,), (block,), (bufs[(r + j) % len(bufs)], n, sink), stream=stream)

    before = (lambda: hold(stream)) if hold is not None else None
    ms = time_regions(cupy_clock(cp), reps, stream, flush, body, stream.synchronize, before)
    return [m / max(launches, 1) for m in ms]


def _time_graph(cp, fn, grid, block, bufs, n, sink, flush, stream, reps: int, warmup: int) -> list[float]:
    """ms per launch under the graph timer: one CUDA graph of len(bufs) back-to-back launches, one per
    buffer, replayed after each flush between a pair of events (``cake_core.runtime.timing``'s helpers)."""
    def enqueue() -> None:
        for b in bufs:
            fn((grid,), (block,), (b, n, sink), stream=stream)

    graph = capture_graph(stream, enqueue)
    for _ in range(warmup):
        graph.launch(stream)
    ms = time_regions(cupy_clock(cp), reps, stream, flush, lambda r: graph.launch(stream), stream.synchronize)
    return [m / len(bufs) for m in ms]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="8,32,128,512", help="sizes to read, MiB")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hold-us", type=float, default=50.0, help="the probes' GPU-side hold after the flush")
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
    hold_fn = mod.get_function("hold")
    band_fn = mod.get_function("read_band")

    def hold(s) -> None:   # keeps the GPU busy until the host has queued the whole timed region
        hold_fn((1,), (1,), (np.uint64(args.hold_us * 1000),), stream=s)

    def row(mib, kernel, grid, block, ms, **kw):
        return {"mib": mib, "kernel": kernel, "grid": grid, "block": block, "median_ms": float(np.median(ms)),
                "p10_ms": float(np.percentile(ms, 10)), "p90_ms": float(np.percentile(ms, 90)), **kw}

    probes = []
    with stream:
        ms = _time(cp, empty, 1, 32, [sink], np.uint64(0), sink, flush, stream, args.reps, args.warmup)
        rows.append(row(0, "empty", 1, 32, ms))
        # what the fixed cost is made of: the event pair alone, the launch once the host is surely ahead,
        # and a launch among back-to-back ones
        for name, kw in (("events only", {"launches": 0}), ("empty after hold", {"hold": hold}),
                         ("empty, 20 back-to-back", {"launches": 20}),
                         ("empty, 20 back-to-back after hold", {"launches": 20, "hold": hold})):
            ms = _time(cp, empty, 1, 32, [sink], np.uint64(0), sink, flush, stream, args.reps, args.warmup, **kw)
            probes.append(row(0, name, 1, 32, ms))
        ms = _time_graph(cp, empty, 1, 32, [sink] * 8, np.uint64(0), sink, flush, stream, args.reps, args.warmup)
        probes.append(row(0, "empty, graph of 8", 1, 32, ms))
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
            b = min((r for r in rows if r["mib"] == mib), key=lambda r: r["median_ms"])
            fn = kernels[int(b["kernel"].removeprefix("read_u"))]
            ms = _time(cp, fn, b["grid"], b["block"], bufs, n, sink, flush, stream, args.reps, args.warmup, hold=hold)
            probes.append(row(mib, f"{b['kernel']} after hold", b["grid"], b["block"], ms,
                              tb_per_s=nbytes / float(np.median(ms)) / 1e9))
            g = graph_launches(nbytes)
            bufs += [cp.asarray(host) for _ in range(g - len(bufs))]
            ms = _time_graph(cp, fn, b["grid"], b["block"], bufs[:g], n, sink, flush, stream, args.reps, args.warmup)
            probes.append(row(mib, f"{b['kernel']}, graph of {g} copies", b["grid"], b["block"], ms,
                              tb_per_s=nbytes / float(np.median(ms)) / 1e9))
            side = int(round((nbytes // 2) ** 0.5))
            if side * side * 2 == nbytes and side & (side - 1) == 0:
                # the same bytes read as 64-, 128- and 256-column bands (K split so that there are about
                # as many CTAs as SMs): what a tiled GEMV's access pattern costs against a straight read
                lrow = (side // 8).bit_length() - 1
                for cols in (64, 128, 256):
                    bands = side // cols
                    split = max(1, sms // bands)
                    args_b = (np.int32(side), np.int32(lrow), np.int32((cols // 8).bit_length() - 1),
                              np.int32(split))

                    def band(grid, block, args_, stream, _a=args_b):
                        band_fn(grid, block, (args_[0], *_a, sink), stream=stream)
                    ms = _time_graph(cp, band, bands * split, 1024, bufs[:g], n, sink, flush, stream, args.reps,
                                     args.warmup)
                    probes.append(row(mib, f"{cols}-column bands, K split {split}, graph of {g}", bands * split,
                                      1024, ms, tb_per_s=nbytes / float(np.median(ms)) / 1e9))
            del bufs
    best = {}
    for r in rows:
        if r["mib"] and (r["mib"] not in best or r["median_ms"] < best[r["mib"]]["median_ms"]):
            best[r["mib"]] = r
    result = {"script": "bench/read_floor.py", "gpu": gpu_model(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "protocol": "CUDA events around one launch; 256 MiB read flush before each; buffers rotated among "
                          f"{MAX_COPIES} copies under 64 MiB; median of {args.reps} after {args.warmup} warm-ups",
              "seconds": round(time.perf_counter() - t0, 1), "rows": rows, "best": list(best.values()),
              "probes": probes, "hold_us": args.hold_us}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "read_floor.json").write_text(json.dumps(result, indent=1))
    e = rows[0]
    print(f"empty launch: {1e3 * e['median_ms']:.2f} us median (p10 {1e3 * e['p10_ms']:.2f}, "
          f"p90 {1e3 * e['p90_ms']:.2f})")
    for p in probes:
        print(f"  {p['mib']:>4} MiB {p['kernel']:<36} {1e3 * p['median_ms']:8.2f} us median "
              f"(p10 {1e3 * p['p10_ms']:.2f}, p90 {1e3 * p['p90_ms']:.2f})")
    print(f"{'MiB':>5} {'best kernel':>12} {'grid':>5} {'block':>5} {'median us':>10} {'TB/s':>6}")
    for mib, r in sorted(best.items()):
        print(f"{mib:>5} {r['kernel']:>12} {r['grid']:>5} {r['block']:>5} {1e3 * r['median_ms']:>10.2f} "
              f"{r['tb_per_s']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
