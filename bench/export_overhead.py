"""The host time an exported package's ``run()`` adds to a launch (``cake export``; target: at most 10 µs a call).

    python3 bench/export_overhead.py DIST/PKG [--shape B=1,N=4096,K=256,D=128] [--calls 20000] [--out DIR]

Imports the package (``DIST`` on sys.path), makes torch tensors of the shape from the manifest's tensors (any
values: the kernel's result is not read), warms the route up (module load, arguments, tensor maps), then times,
on one torch stream:

- ``run``: ``calls`` calls of ``pkg.run(stream=s, **tensors, **scalars)`` back to back, host wall time by
  ``time.perf_counter`` over the whole loop, per call;
- ``launch``: the same number of bare ``cuLaunchKernel`` calls of the route's prepared launch (the package's own
  ctypes buffers, no shape inference, no checks), per call;
- ``gpu``: CUDA events around each of 200 calls of ``run``, median: what the kernel takes on the device;
- ``step_*``: run()'s steps alone (the plan's signature, the tensors' checked addresses, the stream's handle, the
  device, the prepared launch's call, which includes the bare launch), to say where the overhead goes.

The overhead is ``run - launch``. The loop enqueues faster than the GPU drains only while the kernel is short:
the queue may fill (the driver then blocks the host), so a kernel long against the host time is timed with
fewer calls per synchronize (``--batch``). Prints one line per figure and writes export_overhead.json under --out.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "i32": "int32", "i64": "int64", "bool": "bool"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", type=Path, help="the exported package's folder (DIST/PKG)")
    ap.add_argument("--shape", help="a routed shape, e.g. B=1,N=4096,K=256,D=128 (default: the first measured)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256, help="calls between two stream synchronizes")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()

    import torch

    sys.path.insert(0, str(args.package.resolve().parent))
    pkg = importlib.import_module(args.package.name)
    d = pkg._dispatcher
    key = args.shape or next(iter(d.exact))
    shape = pkg.parse_key(key)
    from_manifest = {**d.m["consts"], **shape}
    tensors = {}
    for t in d.tensors:
        dims = [pkg.evaluate(e, from_manifest) for e in t["shape"]]
        tensors[t["name"]] = torch.zeros(dims, dtype=getattr(torch, TORCH_DTYPES[t["dtype"]]), device="cuda")
    scalars = {x: shape[x] for x in d.scalars}     # the dimensions no tensor carries, passed by name
    s = torch.cuda.Stream()
    for _ in range(10):
        pkg.run(stream=s, **tensors, **scalars)
    s.synchronize()
    plan = next(iter(d._plans.values()))
    launch = plan[0]
    drv, handle = d.driver(0), s.cuda_stream

    def timed(call) -> float:
        total, done = 0.0, 0
        while done < args.calls:
            n = min(args.batch, args.calls - done)
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            total += time.perf_counter() - t0
            s.synchronize()
            done += n
        return total / args.calls * 1e6

    run_us = timed(lambda: pkg.run(stream=s, **tensors, **scalars))
    launch_us = timed(lambda: drv.launch(launch.fn, launch.grid, launch.threads, launch.smem_bytes, handle,
                                         launch.params))
    # where run()'s host time goes, step by step (each step alone, the same number of calls): the signature its
    # plan is cached under, the tensors' checked addresses, the stream's handle, the prepared launch's call
    ts, ptr_of = [tensors[n] for n in d.names], plan[2]
    ptrs = [f(t) for f, t in zip(ptr_of, ts)]
    steps = {"signature": lambda: (tuple((t.shape, t.dtype) for t in ts), tuple(scalars.items())),
             "addresses": lambda: [f(t) for f, t in zip(ptr_of, ts)],
             "stream": lambda: pkg.stream_handle(s),
             "device": lambda: pkg._device_of(ts[0]),
             "launch_call": lambda: launch(ptrs, handle, 0)}
    step_us = {name: timed(call) for name, call in steps.items()}
    gpu_ms = []
    for _ in range(200):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(s)
        pkg.run(stream=s, **tensors, **scalars)
        b.record(s)
        b.synchronize()
        gpu_ms.append(a.elapsed_time(b))
    route = pkg.route_of(**shape)
    result = {"package": str(args.package), "shape": key, "kernel": route["kernel"], "device": torch.cuda.get_device_name(),
              "calls": args.calls, "run_us": run_us, "launch_us": launch_us, "overhead_us": run_us - launch_us,
              **{f"step_{k}_us": v for k, v in step_us.items()},
              "gpu_median_ms": statistics.median(gpu_ms), "measured_ms": route["median_ms"]}
    for k, v in result.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "export_overhead.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
