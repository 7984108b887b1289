"""A small corpus_vs_peers result file over programs of today's tree (dated away from any commit)."""
from __future__ import annotations

import json
from pathlib import Path

PROGRAMS = {
    "gemm_bf16/seed:gemm_bf16.cake": ("gemm_bf16", 96, 16384),
    "gemm_bf16/best:gemm_bf16_ws.cake": ("gemm_bf16_ws", 90, 99328),
    "gemm_bf16/best:gemm_bf16_ws_n256.cake": ("gemm_bf16_ws_n256", 154, 197632),
    "gemm_bf16/best:no_such_program.cake": ("no_such_program", 1, 1),
}
TIMES = {"gemm_bf16": 10.0, "gemm_bf16_ws": 0.33, "gemm_bf16_ws_n256": 0.2, "no_such_program": 0.1}
SHAPES = [{"M": 2048, "N": 2048, "K": 2048}, {"M": 4096, "N": 4096, "K": 4096}, {"M": 8192, "N": 8192, "K": 8192}]


def write_bench(path: Path, date: str = "2020-01-0{d} 12:00:00 UTC", day: int = 1, scale: float = 1.0) -> Path:
    rows = []
    for s in SHAPES:
        key = ",".join(f"{k}={v}" for k, v in s.items())
        f = (s["M"] / 4096) ** 3
        ours = [{"shape": s, "correct": True, "median_ms": TIMES[k] * f * scale, "p10_ms": TIMES[k] * f * scale * 0.99,
                 "p90_ms": TIMES[k] * f * scale * 1.01, "runs": 20, "timer": "cuda_event", "l2": "cold-clean",
                 "outcome": "measured", "max_error": 1e-6, "program": "seed" if k == "gemm_bf16" else k}
                for k in TIMES]
        ours.append({"shape": s, "correct": False, "outcome": "wrong", "program": "gemm_bf16_ws"})
        rows.append({"problem": "gemm_bf16", "shape": s, "shape_key": key, "role": "headline", "ours": ours,
                     "peers": []})
    doc = {"date": date.format(d=day), "gpu": "NVIDIA H200", "command": "bench/corpus_vs_peers.py",
           "floor": {}, "protocol": "CUDA events",
           "programs": {k: {"ok": True, "kernel": kern, "resources": {"registers": regs, "spill_bytes": 0,
                                                                      "smem_bytes": smem, "barriers": 1}}
                        for k, (kern, regs, smem) in PROGRAMS.items()},
           "rows": rows}
    path.write_text(json.dumps(doc))
    return path
