"""Programs and synthetic measurements for the cost-model tests."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.text import parse_program
from cake_core.model.base import Sample
from cake_core.problems import corpus_file



def seed(name: str):
    return parse_program(corpus_file(f"{name}.cake").read_text())


def gemm_variants():
    """Warp-specialised GEMMs that differ in structure: tile width, ring depth."""
    ws = seed("gemm_bf16_ws")
    return [ws, ws.with_consts(BN=128), ws.with_consts(S=2), seed("gemm_bf16_ws_n256"), seed("gemm_bf16")]


def measured(programs, shapes, truth, run_id, problem="gemm_bf16", gpu="H200"):
    """Samples of every program at every shape, 'measured' as ``truth(program, shape)``."""
    return [Sample.of(p, s, gpu, problem=problem, measured_ms=truth(p, s), run_id=run_id)
            for p in programs for s in shapes]
