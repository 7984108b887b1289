"""What the C = A @ B problems share (bf16 A[M, K] and B[K, N], fp32 C): the fp64 product, the row oracle
(a row is a row of C, fed by a row of A), and the cuBLAS peers through torch."""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems.base import RowOracle, array_module
from cake_core.problems.peer import PeerRun, PeerUnavailable, device_copies, library, to_device, to_numpy, torch_cuda

# a peer that writes C in bf16 (torch.matmul on bf16 tensors) is checked at the problems' fp32-output
# tolerance plus bf16's rounding of the output (half an ulp: 2^-8 of the element at worst); at 2e-3
# alone it fails (2.1e-3 .. 3.7e-3 on every H200 cell but two)
BF16_C_RTOL = 2e-3 + 2.0 ** -8


def matmul_f64(a: Any, b: Any) -> Any:
    """a @ b in fp64 (numpy's BLAS on a CPU, cuBLAS's DGEMM on a GPU)."""
    xp = array_module(a, b)
    return a.astype(xp.float64) @ b.astype(xp.float64)


def oracle(x: dict[str, Any]) -> dict[str, Any]:
    return {"c": matmul_f64(x["a"], x["b"])}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"c": matmul_f64(x["a"][array_module(x["a"]).asarray(rows)], x["b"])}


ROWS = RowOracle(
    count=lambda s: s["M"],
    oracle=_oracle_rows,
    take=lambda out, rows: {"c": out["c"][array_module(out["c"]).asarray(rows)]},
    rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["a"].shape[1]),
)


def flops(s: dict[str, int]) -> float:
    return 2.0 * s["M"] * s["N"] * s["K"]


def nbytes(s: dict[str, int]) -> float:
    """bf16 A and B read once, fp32 C written once."""
    return 2.0 * (s["M"] * s["K"] + s["K"] * s["N"]) + 4.0 * s["M"] * s["N"]


def weight_bytes(s: dict[str, int]) -> float:
    """B's bytes: the read that bounds a decode-sized product."""
    return 2.0 * s["N"] * s["K"]


def matmul_bf16_c(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """torch.matmul on bf16 tensors (cuBLAS), bf16 C."""
    torch = torch_cuda()
    sets = device_copies(torch, {"a": to_device(torch, inputs["a"], torch.bfloat16),
                                 "b": to_device(torch, inputs["b"], torch.bfloat16)}, copies)
    out = torch.empty((inputs["a"].shape[0], inputs["b"].shape[1]), device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        torch.matmul(s["a"], s["b"], out=out)

    return PeerRun(problem, "torch.matmul (cuBLAS, bf16 C)", library(torch), run,
                   lambda: {"c": to_numpy(out.float())}, len(sets),
                   note="bf16 C (2 bytes/elem against the problem's fp32): checked at rtol "
                        f"{BF16_C_RTOL:.3g} (the problem's + bf16 output rounding)", rtol=BF16_C_RTOL,
                   _keep=[sets, out])


def mm_f32_c(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """torch.mm(out_dtype=float32) on bf16 tensors (cuBLAS): the fp32 C the problem asks for."""
    torch = torch_cuda()
    sets = device_copies(torch, {"a": to_device(torch, inputs["a"], torch.bfloat16),
                                 "b": to_device(torch, inputs["b"], torch.bfloat16)}, copies)
    try:
        torch.mm(sets[0]["a"][:1, :8], sets[0]["b"][:8, :8], out_dtype=torch.float32)
    except TypeError as e:
        raise PeerUnavailable(f"this torch ({torch.__version__}) has no torch.mm(..., out_dtype=): {e}") from None
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["c"] = torch.mm(s["a"], s["b"], out_dtype=torch.float32)

    return PeerRun(problem, "torch.mm out_dtype=f32 (cuBLAS)", library(torch), run,
                   lambda: {"c": to_numpy(box["c"])}, len(sets), note="fp32 output, as the problem",
                   _keep=[sets, box])


PEERS = {"torch.matmul": matmul_bf16_c, "torch.mm_f32": mm_f32_c}
