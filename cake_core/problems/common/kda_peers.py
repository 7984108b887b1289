"""What the KDA problems' peers share: the inputs as torch tensors (bf16 q, k, v; f32 g, beta and state) and
flash-linear-attention's KDA ops, imported when a peer is made."""
from __future__ import annotations

from typing import Any, Callable

from cake_core.problems.peer import PeerUnavailable, device_copies, to_device


def device_sets(torch, inputs: dict[str, Any], copies: int | None) -> list[dict[str, Any]]:
    """The inputs on the GPU (see ``peer.device_copies``): q, k, v bf16; g, beta and the state s f32."""
    t = {n: to_device(torch, inputs[n], torch.bfloat16) for n in ("q", "k", "v")}
    t.update({n: to_device(torch, inputs[n], torch.float32) for n in ("g", "beta", "s")})
    return device_copies(torch, t, copies)


def fla_op(name: str) -> tuple[Callable[..., Any], str]:
    """``fla.ops.kda.<name>`` and the library's version text, or PeerUnavailable saying what to install."""
    try:
        import fla  # noqa: PLC0415
        from fla.ops import kda  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"flash-linear-attention does not import here ({type(e).__name__}: {e}); install the "
                              "flash-linear-attention wheel on the GPU machine") from None
    return getattr(kda, name), f"flash-linear-attention {getattr(fla, '__version__', '?')}"
