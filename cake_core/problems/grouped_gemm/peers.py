"""Peers: the grouped product in torch as serving engines without a fused kernel run it. ``torch._grouped_mm`` on
the permuted tokens (x[perm] as A, w as B, offsets[1:] as the groups' ends; bf16 out, fp32 accumulation), and a
loop over the experts with one cuBLAS product each (fp32 out)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.matmul import BF16_C_RTOL
from cake_core.problems.peer import (PeerRun, PeerUnavailable, device_copies, library, mm_f32, to_device, to_numpy,
                                     torch_cuda)


def _tensors(torch, inputs: dict[str, Any], copies: int | None) -> list[dict[str, Any]]:
    bf16 = lambda name: to_device(torch, inputs[name], torch.bfloat16)     # noqa: E731
    return device_copies(torch, {"x": bf16("x"), "w": bf16("w"),
                                 "perm": to_device(torch, inputs["perm"], torch.int64),
                                 "offsets": to_device(torch, inputs["offsets"], torch.int32)}, copies)


def grouped_mm(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    if not hasattr(torch, "_grouped_mm"):
        raise PeerUnavailable(f"torch {torch.__version__} has no torch._grouped_mm (torch 2.8 or later has it)")
    sets = _tensors(torch, inputs, copies)
    for s in sets:
        s["w"] = s["w"].transpose(1, 2).contiguous().transpose(1, 2)    # column-major experts: _grouped_mm's B
        s["ends"] = s["offsets"][1:].contiguous()
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["y"] = torch._grouped_mm(s["x"][s["perm"]], s["w"], offs=s["ends"])

    return PeerRun(problem, "torch._grouped_mm", library(torch), run, lambda: {"y": to_numpy(box["y"].float())},
                   len(sets), note=f"bf16 y (checked at rtol {BF16_C_RTOL:.3g}: the problem's and bf16's rounding "
                                   "of the output); the experts laid out column-major outside the timed region",
                   rtol=BF16_C_RTOL, _keep=[sets, box])


def expert_loop(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    sets = _tensors(torch, inputs, copies)
    bounds = to_numpy(sets[0]["offsets"]).tolist()
    groups = [(e, a, b) for e, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]
    y = torch.empty((bounds[-1], inputs["w"].shape[2]), device="cuda", dtype=torch.float32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        for e, a, b in groups:
            y[a:b] = mm_f32(torch, s["x"][s["perm"][a:b]], s["w"][e])

    return PeerRun(problem, "torch loop over experts (cuBLAS)", library(torch), run, lambda: {"y": to_numpy(y)},
                   len(sets), note="one fp32-out product per expert with rows; the group bounds read to the host "
                                   "outside the timed region", _keep=[sets, y])


PEERS = {"torch.grouped_mm": grouped_mm, "torch.expert_loop": expert_loop}
