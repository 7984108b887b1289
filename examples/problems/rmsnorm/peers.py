"""Peers: torch's ``rms_norm`` (``torch.nn.functional.rms_norm``, torch >= 2.4; the plain expression
``x * rsqrt(mean(x^2) + eps) * w`` where it is missing), on fp32 copies of the inputs (fp32 y, as the problem),
and on the bf16 tensors themselves (bf16 y, half the output bytes)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, device_copies, library, to_device, to_numpy, torch_cuda

EPS = 1e-6
# a bf16 y carries bf16's rounding of the output (half an ulp: up to 2^-8 of the element) on top of the
# problem's tolerance
BF16_Y_RTOL = 1e-4 + 2.0 ** -8


def _rms_norm(torch):
    """(x, w) -> y: torch.nn.functional.rms_norm where this torch has it, else the plain expression."""
    fn = getattr(torch.nn.functional, "rms_norm", None)
    if fn is not None:
        return lambda x, w: fn(x, (x.shape[-1],), w, EPS), "torch.nn.functional.rms_norm"

    def plain(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)
    return plain, "x * rsqrt(mean(x^2) + eps) * w"


def _sets(torch, inputs: dict[str, Any], dtype, copies: int | None) -> list[dict[str, Any]]:
    return device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "w": to_device(torch, inputs["w"], dtype)}, copies)


def rms_norm_f32(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """rms_norm on x.float() and w.float(): fp32 y, the problem's output; x's conversion is timed with it."""
    torch = torch_cuda()
    fn, what = _rms_norm(torch)
    sets = _sets(torch, inputs, torch.float32, copies)
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["y"] = fn(s["x"].float(), s["w"])

    return PeerRun(problem, f"{what} (fp32)", library(torch), run, lambda: {"y": to_numpy(box["y"])}, len(sets),
                   note="timed: the bf16->fp32 copy of x and the norm; fp32 y, as the problem", _keep=[sets, box])


def rms_norm_bf16(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """rms_norm on the bf16 tensors: bf16 y (2 bytes an element against the problem's 4)."""
    torch = torch_cuda()
    fn, what = _rms_norm(torch)
    sets = _sets(torch, inputs, torch.bfloat16, copies)
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["y"] = fn(s["x"], s["w"])

    return PeerRun(problem, f"{what} (bf16 y)", library(torch), run, lambda: {"y": to_numpy(box["y"].float())},
                   len(sets), note=f"bf16 y: checked at rtol {BF16_Y_RTOL:.3g} (the problem's + bf16 output rounding)",
                   rtol=BF16_Y_RTOL, _keep=[sets, box])


PEERS = {"torch.rms_norm": rms_norm_f32, "torch.rms_norm_bf16": rms_norm_bf16}
