"""Peers: flash-kmeans' Triton assign kernel, and torch unfused (bmm with fp32 output, then c_sq - 2·dot and argmin)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.flash_kmeans import flash_kmeans
from cake_core.problems.peer import PeerRun, device_copies, library, mm_f32, to_device, to_numpy, torch_cuda


def flash(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    fk_assign, _, lib = flash_kmeans()
    x = to_device(torch, inputs["x"], torch.bfloat16)
    t = {"x": x, "c": to_device(torch, inputs["c"], torch.bfloat16),
         "c_sq": to_device(torch, inputs["c_sq"], torch.float32),
         # its API takes ||x||^2 too (setup, not timed; the argmin does not depend on it)
         "x_sq": (x.float() ** 2).sum(-1)}
    sets = device_copies(torch, t, copies)
    out = torch.empty(inputs["x"].shape[:2], device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        fk_assign.euclid_assign_triton(s["x"], s["c"], s["x_sq"], out=out, c_sq=s["c_sq"])

    return PeerRun(problem, "flash-kmeans euclid_assign_triton", f"{lib}, {library(torch)}", run,
                   lambda: {"out": to_numpy(out)}, len(sets),
                   note="its heuristic config (use_heuristic=True); x_sq = ||x||^2 precomputed, not timed",
                   _keep=[sets, out])


def unfused(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    sets = device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "c": to_device(torch, inputs["c"], torch.bfloat16),
                                 "c_sq": to_device(torch, inputs["c_sq"], torch.float32)}, copies)
    out = torch.empty(inputs["x"].shape[:2], device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        scores = mm_f32(torch, s["x"], s["c"].mT)                    # (B, N, K) fp32
        scores.mul_(-2.0).add_(s["c_sq"][:, None, :])
        out.copy_(scores.argmin(dim=-1))

    return PeerRun(problem, "torch unfused (bmm f32 + argmin)", library(torch), run,
                   lambda: {"out": to_numpy(out)}, len(sets),
                   note="materialises the (B, N, K) fp32 score matrix", _keep=[sets, out])


PEERS = {"flash-kmeans": flash, "torch": unfused}
