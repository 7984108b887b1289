"""Peer: the layer in torch as serving engines without a fused MoE kernel run it: softmax and ``topk`` routing, the
tokens permuted by expert, ``torch._grouped_mm`` for the gate/up and the down projections (bf16 in, bf16 out,
fp32 accumulation), SiLU(gate) * up between them, and the weighted un-permute sum (``index_add_``)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, PeerUnavailable, device_copies, library, to_device, to_numpy, torch_cuda


def grouped_mm(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    if not hasattr(torch, "_grouped_mm"):
        raise PeerUnavailable(f"torch {torch.__version__} has no torch._grouped_mm (torch 2.8 or later has it)")
    k = int(inputs["_k"])
    E, H, I = inputs["w_gate"].shape

    def column_major(w):
        # each expert's matrix column-major: the layout _grouped_mm's second operand takes
        return w.transpose(1, 2).contiguous().transpose(1, 2)

    bf16 = lambda name: to_device(torch, inputs[name], torch.bfloat16)     # noqa: E731
    w13 = column_major(torch.cat([bf16("w_gate"), bf16("w_up")], dim=2))       # (E, H, 2I)
    w2 = column_major(bf16("w_down"))                                           # (E, I, H)
    sets = device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "logits": to_device(torch, inputs["logits"], torch.float32)}, copies)
    M = sets[0]["x"].shape[0]
    box: dict[str, Any] = {"out": torch.zeros((M, H), device="cuda", dtype=torch.float32)}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        p = torch.softmax(s["logits"], dim=-1)
        w, ids = torch.topk(p, k, dim=-1)                      # largest first
        w = w / w.sum(dim=-1, keepdim=True)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        tok = order // k
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        gu = torch._grouped_mm(s["x"][tok], w13, offs=offs)                        # (M k, 2I) bf16
        h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        y = torch._grouped_mm(h, w2, offs=offs)                                     # (M k, H) bf16
        y = y.float() * w.flatten()[order, None]
        out = box["out"]
        out.zero_()
        out.index_add_(0, tok, y)
        box["ids"], box["w"] = ids, w

    return PeerRun(problem, "torch softmax/topk + torch._grouped_mm", library(torch), run,
                   lambda: {"out": to_numpy(box["out"]), "topk_ids": to_numpy(box["ids"].to(torch.int32)),
                            "topk_weights": to_numpy(box["w"])}, len(sets),
                   note="bf16 grouped-GEMM outputs (gate/up and down) before the f32 weighted sum; the weights are "
                        "laid out for _grouped_mm outside the timed region",
                   rtol=2e-2, _keep=[sets, box, w13, w2])


PEERS = {"torch.grouped_mm": grouped_mm}
