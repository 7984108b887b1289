"""What a problem's peers are written with: the :class:`PeerRun` a peer factory returns, and the helpers that take
a problem's inputs onto the GPU as torch tensors.

A problem names its peers in ``Problem.peers``: peer name -> factory ``(problem, inputs, copies) -> PeerRun``.
``inputs`` are the problem's own (``make_inputs``: CuPy arrays drawn on the device, copied on the device through
their ``__cuda_array_interface__``, or numpy arrays, uploaded); ``copies`` is passed on to
:func:`device_copies`. The factory returns a ``run(i)`` that runs the peer once on device copy ``i`` of the
inputs (on torch's current stream), a ``fetch()`` that returns the last run's outputs as numpy arrays under the
problem's output names, and a ``reset()`` where outputs are accumulators to zero before a run.
``cake_core.runtime.peers`` times and checks them with the protocol our kernels are timed with.

torch is imported only when a peer is made (:func:`torch_cuda`), so a problem imports on a machine without it;
a peer whose library is missing raises :class:`PeerUnavailable` with what to install.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from cake_core.errors import CakeError


class PeerUnavailable(CakeError):
    """The peer cannot run here: its library (torch, flash-kmeans) or a CUDA GPU is missing."""


@dataclass
class PeerRun:
    problem: str
    peer: str                                     # e.g. "torch.matmul (cuBLAS)"
    library: str                                  # e.g. "torch 2.11.0+cu130"
    run: Callable[[int], None]                    # one run on input copy i % copies, on the current stream
    fetch: Callable[[], dict[str, np.ndarray]]    # outputs of the last run, host arrays, the problem's names
    copies: int = 1
    reset: Callable[[], None] | None = None       # zero accumulators before a run (outside the timed region)
    note: str = ""
    rtol: float | None = None                     # the tolerance it is checked at, where not the problem's
    _keep: list = field(default_factory=list, repr=False)   # device tensors; ``release`` drops them

    def release(self) -> None:
        self._keep.clear()
        self.run = self.fetch = self.reset = None   # type: ignore[assignment]


# ---------------------------------------------------------------- helpers

def torch_cuda():
    """torch, imported now, with a CUDA GPU (else :class:`PeerUnavailable` saying what is missing)."""
    try:
        import torch  # noqa: PLC0415 - lazily: CPU CI has no torch
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"the peers need PyTorch with CUDA, which does not import here ({type(e).__name__}: "
                              f"{e}); run on the GPU machine, whose image has it") from None
    if not torch.cuda.is_available():
        raise PeerUnavailable("PyTorch sees no CUDA GPU here (torch.cuda.is_available() is False); run the peers "
                              "on the GPU machine")
    return torch


def library(torch) -> str:
    return f"torch {torch.__version__}"


def on_device(x: Any) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def to_device(torch, x: Any, dtype):
    """A CUDA tensor of ``dtype`` of its own (contiguous) holding ``x``: a device array (CuPy) is read where it
    lies, through its ``__cuda_array_interface__`` (a device-to-device copy: a peer never writes into the
    caller's inputs), a numpy array is uploaded. float32 values already rounded to bf16 convert to bf16 exactly."""
    if on_device(x):
        return torch.as_tensor(x, device="cuda").to(dtype, copy=True, memory_format=torch.contiguous_format)
    return torch.from_numpy(np.ascontiguousarray(x)).to("cuda").to(dtype)


def device_copies(torch, tensors: dict[str, Any], copies: int | Callable[[int], int] | None) -> list[dict[str, Any]]:
    """``tensors`` and ``n - 1`` clones of them, for timed runs that rotate among input copies; ``copies`` is the
    count ``n``, or a function of the tensors' bytes that gives it (what the runtime passes); None: one."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    n = copies(nbytes) if callable(copies) else (copies or 1)
    return [tensors] + [{k: v.clone() for k, v in tensors.items()} for _ in range(max(n, 1) - 1)]


def mm_f32(torch, a, b):
    """a @ b (2-D or batched) of bf16 tensors with fp32 output, as cuBLAS computes it (bf16 products,
    fp32 accumulation). torch ≥ 2.8 takes ``out_dtype``; older ones upcast and use TF32, which holds
    bf16 values exactly, so the products are the same."""
    f = torch.bmm if a.dim() == 3 else torch.mm
    try:
        return f(a, b, out_dtype=torch.float32)
    except TypeError:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return f(a.float(), b.float())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev


def to_numpy(t) -> np.ndarray:
    """A torch tensor's values as a numpy array on the host."""
    return t.detach().cpu().numpy()
