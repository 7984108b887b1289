"""Peer: torch batched mm (fp32 output) + ``topk``, the row norms computed in the timed run (none is given)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, device_copies, library, mm_f32, to_device, to_numpy, torch_cuda


def mm_topk(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    k = int(inputs["_k"])
    sets = device_copies(torch, {"q": to_device(torch, inputs["q"], torch.bfloat16),
                                 "db": to_device(torch, inputs["db"], torch.bfloat16)}, copies)
    B, Q = inputs["q"].shape[:2]
    dists = torch.empty((B, Q, k), device="cuda", dtype=torch.float32)
    idx = torch.empty((B, Q, k), device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        q_sq = (s["q"].float() ** 2).sum(-1)                          # (B, Q)
        db_sq = (s["db"].float() ** 2).sum(-1)                        # (B, M)
        scores = mm_f32(torch, s["q"], s["db"].transpose(1, 2))       # (B, Q, M) fp32
        scores.mul_(-2.0).add_(db_sq[:, None, :])
        top = torch.topk(scores, k, dim=2, largest=False, sorted=True)
        dists.copy_(top.values.add_(q_sq[:, :, None]).clamp_min_(0.0))
        idx.copy_(top.indices)

    return PeerRun(problem, "torch bmm f32 + topk", library(torch), run,
                   lambda: {"dists": to_numpy(dists), "idx": to_numpy(idx)}, len(sets),
                   note="materialises the (B, Q, M) fp32 score matrix; ||q||^2 and ||db||^2 computed in the timed run",
                   _keep=[sets, dists, idx])


PEERS = {"torch": mm_topk}
