"""Peers: the libraries each problem is measured against, run on the GPU on the problem's own inputs.

For every problem, ``PEERS[problem]`` names its peers; ``make_peer(problem, peer, inputs)`` takes the
problem's inputs (``Problem.make_inputs``) onto the GPU as torch tensors and returns a :class:`PeerRun`:
inputs drawn on the device (CuPy: the gate's own draw, ``problems.base.input_sampler(seed, shape, cupy)``,
so a peer runs on the very values our kernels are checked and timed on) are copied on the device through
their ``__cuda_array_interface__``, never through the host; numpy inputs are uploaded. Then a
``run(i)`` that runs the peer once on device copy ``i`` of the inputs (on torch's current stream),
a ``fetch()`` that returns the last run's outputs as numpy arrays under the problem's output names
(so ``Problem.compare`` checks them against the same oracle as our kernels), and ``reset()`` where
the outputs are accumulators that must be zeroed before a run (kmeans_update). :func:`time_peer`
times a peer with the protocol our kernels are timed with (``runtime.timing``, as
``runtime.gpu.check_and_time`` uses it): CUDA events around each run on one stream, warm-up first, a
read of ``L2_FLUSH_BYTES`` before every timed run (cold, clean L2), inputs rotated among up to 4 copies
when they are small, median / p10 / p90 of at least 20 runs. :func:`measure_peer` does both for one
(seed, shape) as the gate does for our kernels: their device draw, their (cached) reference, their check.

Peers:
  gemm_bf16, tinygemm  torch.matmul on bf16 tensors (cuBLAS; bf16 C) and torch.mm(out_dtype=float32)
                       (cuBLAS; fp32 C, the problem's own output type)
  kmeans_assign        flash-kmeans 0.3.1 ``euclid_assign_triton`` (Triton), and torch unfused
                       (bmm with fp32 output, then c_sq - 2·dot and argmin)
  kmeans_update        flash-kmeans ``triton_centroid_update_sorted_euclid`` (sort by cluster, then
                       chunked sums; ``calculate_new=False`` leaves sums and counts, our outputs),
                       flash-kmeans unsorted (its per-point atomic kernel ``_centroid_update_kernel``,
                       launched as ``triton_centroid_update_euclid`` launches it, into our buffers:
                       the public wrapper returns means only), and torch ``index_add_`` + ``bincount``
  knn_topk             torch mm (fp32 output) + ``topk``

torch and flash_kmeans are imported only when a peer is made, so this module imports on a machine
with neither; a peer whose library is missing raises :class:`PeerUnavailable` with what to install.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from cake_core.errors import CakeError
from cake_core.problems.base import Problem, Shape
from cake_core.runtime.gate import CheckInfo, compare_to, info_for
from cake_core.runtime.gpu import device_kind, device_reference
from cake_core.runtime.references import ReferenceCache
from cake_core.runtime.timing import (L2_FLUSH_BYTES, L2_STATE, MIN_REPS, TIMERS, input_copies, stats, time_regions,
                                      torch_clock)

FLASH_KMEANS_VERSION = "0.3.1"
# a peer that writes C in bf16 (torch.matmul on bf16 tensors) is checked at the problem's fp32-output
# tolerance plus bf16's rounding of the output (half an ulp: 2^-8 of the element at worst); at 2e-3
# alone it fails (seen on the H200, 2026-11-29: 2.1e-3 .. 3.7e-3 on every gemm/tinygemm cell but two)
BF16_C_RTOL = 2e-3 + 2.0 ** -8


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


# ---------------------------------------------------------------- imports, lazily

def _torch():
    try:
        import torch  # noqa: PLC0415 - lazily: CPU CI has no torch
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"the peers need PyTorch with CUDA, which does not import here ({type(e).__name__}: "
                              f"{e}); run on the GPU machine, whose image has it") from None
    if not torch.cuda.is_available():
        raise PeerUnavailable("PyTorch sees no CUDA GPU here (torch.cuda.is_available() is False); run the peers "
                              "on the GPU machine")
    return torch


def _flash_kmeans():
    _torch()
    try:   # the Triton modules themselves: the package's __init__ silently falls back to torch without Triton
        import flash_kmeans  # noqa: PLC0415
        from flash_kmeans import assign_euclid_triton, centroid_update_triton  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(
            f"flash-kmeans (with its Triton kernels) does not import here ({type(e).__name__}: {e}). It is a "
            f"pure-Python wheel: `pip download --no-deps flash-kmeans=={FLASH_KMEANS_VERSION}` where pip works, "
            "carry the wheel, `pip install --no-deps --target DIR` it and put DIR on PYTHONPATH") from None
    version = getattr(flash_kmeans, "__version__", "?")
    return assign_euclid_triton, centroid_update_triton, f"flash-kmeans {version}"


def _lib(torch) -> str:
    return f"torch {torch.__version__}"


# ---------------------------------------------------------------- helpers

def _on_device(x: Any) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def _dev(torch, x: Any, dtype):
    """A CUDA tensor of ``dtype`` of its own (contiguous) holding ``x``: a device array (CuPy) is read where it
    lies, through its ``__cuda_array_interface__`` (a device-to-device copy: a peer never writes into the
    caller's inputs), a numpy array is uploaded. float32 values already rounded to bf16 convert to bf16 exactly."""
    if _on_device(x):
        return torch.as_tensor(x, device="cuda").to(dtype, copy=True, memory_format=torch.contiguous_format)
    return torch.from_numpy(np.ascontiguousarray(x)).to("cuda").to(dtype)


def _copies(torch, tensors: dict[str, Any], copies: int | None) -> list[dict[str, Any]]:
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    n = copies if copies is not None else input_copies(nbytes)
    return [tensors] + [{k: v.clone() for k, v in tensors.items()} for _ in range(max(n, 1) - 1)]


def _mm_f32(torch, a, b):
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


def _host(t) -> np.ndarray:
    return t.detach().cpu().numpy()


# ---------------------------------------------------------------- gemm_bf16, tinygemm

def _gemm_matmul(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    sets = _copies(torch, {"a": _dev(torch, inputs["a"], torch.bfloat16),
                           "b": _dev(torch, inputs["b"], torch.bfloat16)}, copies)
    out = torch.empty((inputs["a"].shape[0], inputs["b"].shape[1]), device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        torch.matmul(s["a"], s["b"], out=out)

    return PeerRun(problem, "torch.matmul (cuBLAS, bf16 C)", _lib(torch), run,
                   lambda: {"c": _host(out.float())}, len(sets),
                   note="bf16 C (2 bytes/elem against the problem's fp32): checked at rtol "
                        f"{BF16_C_RTOL:.3g} (the problem's + bf16 output rounding)", rtol=BF16_C_RTOL,
                   _keep=[sets, out])


def _gemm_mm_f32(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    sets = _copies(torch, {"a": _dev(torch, inputs["a"], torch.bfloat16),
                           "b": _dev(torch, inputs["b"], torch.bfloat16)}, copies)
    try:
        torch.mm(sets[0]["a"][:1, :8], sets[0]["b"][:8, :8], out_dtype=torch.float32)
    except TypeError as e:
        raise PeerUnavailable(f"this torch ({torch.__version__}) has no torch.mm(..., out_dtype=): {e}") from None
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["c"] = torch.mm(s["a"], s["b"], out_dtype=torch.float32)

    return PeerRun(problem, "torch.mm out_dtype=f32 (cuBLAS)", _lib(torch), run,
                   lambda: {"c": _host(box["c"])}, len(sets), note="fp32 output, as the problem",
                   _keep=[sets, box])


# ---------------------------------------------------------------- kmeans_assign

def _assign_flash(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    fk_assign, _, lib = _flash_kmeans()
    x = _dev(torch, inputs["x"], torch.bfloat16)
    t = {"x": x, "c": _dev(torch, inputs["c"], torch.bfloat16),
         "c_sq": _dev(torch, inputs["c_sq"], torch.float32),
         # its API takes ||x||^2 too (setup, not timed; the argmin does not depend on it)
         "x_sq": (x.float() ** 2).sum(-1)}
    sets = _copies(torch, t, copies)
    out = torch.empty(inputs["x"].shape[:2], device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        fk_assign.euclid_assign_triton(s["x"], s["c"], s["x_sq"], out=out, c_sq=s["c_sq"])

    return PeerRun(problem, "flash-kmeans euclid_assign_triton", f"{lib}, {_lib(torch)}", run,
                   lambda: {"out": _host(out)}, len(sets),
                   note="its heuristic config (use_heuristic=True); x_sq = ||x||^2 precomputed, not timed",
                   _keep=[sets, out])


def _assign_torch(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    sets = _copies(torch, {"x": _dev(torch, inputs["x"], torch.bfloat16),
                           "c": _dev(torch, inputs["c"], torch.bfloat16),
                           "c_sq": _dev(torch, inputs["c_sq"], torch.float32)}, copies)
    out = torch.empty(inputs["x"].shape[:2], device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        scores = _mm_f32(torch, s["x"], s["c"].mT)                    # (B, N, K) fp32
        scores.mul_(-2.0).add_(s["c_sq"][:, None, :])
        out.copy_(scores.argmin(dim=-1))

    return PeerRun(problem, "torch unfused (bmm f32 + argmin)", _lib(torch), run,
                   lambda: {"out": _host(out)}, len(sets),
                   note="materialises the (B, N, K) fp32 score matrix", _keep=[sets, out])


# ---------------------------------------------------------------- kmeans_update

def _update_buffers(torch, inputs):
    B, N, D = inputs["x"].shape
    K = int(inputs["_K"])
    return (torch.zeros((B, K, D), device="cuda", dtype=torch.float32),
            torch.zeros((B, K), device="cuda", dtype=torch.int32), K)


def _update_flash_sorted(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    _, fk_update, lib = _flash_kmeans()
    sets = _copies(torch, {"x": _dev(torch, inputs["x"], torch.bfloat16),
                           "assign": _dev(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    old = torch.zeros((inputs["x"].shape[0], K, inputs["x"].shape[2]), device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        fk_update.triton_centroid_update_sorted_euclid(s["x"], s["assign"], old, centroid_sums=sums,
                                                       centroid_cnts=counts, calculate_new=False)

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "flash-kmeans sorted update", f"{lib}, {_lib(torch)}", run,
                   lambda: {"sums": _host(sums), "counts": _host(counts)}, len(sets), reset,
                   note="timed: its torch.sort of the assignments + the chunked-sum kernel; "
                        "calculate_new=False (sums and counts, no division)", _keep=[sets, sums, counts, old])


def _update_flash_unsorted(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    _, fk_update, lib = _flash_kmeans()
    kernel = getattr(fk_update, "_centroid_update_kernel", None)
    if kernel is None:
        raise PeerUnavailable(f"{lib} has no _centroid_update_kernel (the unsorted update's kernel)")
    sets = _copies(torch, {"x": _dev(torch, inputs["x"], torch.bfloat16),
                           "assign": _dev(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    B, N, D = inputs["x"].shape

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        x = s["x"]
        # the launch triton_centroid_update_euclid makes (one program per point, 128 dims each),
        # into our sums/counts; the wrapper itself allocates its own and returns only the means
        kernel[(B * N,)](x, s["assign"], sums, counts,
                         x.stride(0), x.stride(1), x.stride(2),
                         sums.stride(0), sums.stride(1), sums.stride(2),
                         counts.stride(0), counts.stride(1),
                         B, N, D, K, BLOCK_D=128)

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "flash-kmeans unsorted update (atomics)", f"{lib}, {_lib(torch)}", run,
                   lambda: {"sums": _host(sums), "counts": _host(counts)}, len(sets), reset,
                   note="its _centroid_update_kernel launched as triton_centroid_update_euclid does",
                   _keep=[sets, sums, counts])


def _update_torch(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    sets = _copies(torch, {"x": _dev(torch, inputs["x"], torch.bfloat16),
                           "assign": _dev(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    B, N, D = inputs["x"].shape
    base = (torch.arange(B, device="cuda", dtype=torch.int64) * K)[:, None]

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        flat = (s["assign"].long() + base).reshape(-1)
        sums.view(B * K, D).index_add_(0, flat, s["x"].reshape(B * N, D).float())
        counts.view(-1).add_(torch.bincount(flat, minlength=B * K).to(torch.int32))

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "torch index_add_ + bincount", _lib(torch), run,
                   lambda: {"sums": _host(sums), "counts": _host(counts)}, len(sets), reset,
                   note="timed: index arithmetic, the bf16→fp32 copy of x, index_add_ and bincount",
                   _keep=[sets, sums, counts, base])


# ---------------------------------------------------------------- knn_topk

def _knn_torch(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = _torch()
    k = int(inputs["_k"])
    sets = _copies(torch, {"q": _dev(torch, inputs["q"], torch.bfloat16),
                           "db": _dev(torch, inputs["db"], torch.bfloat16)}, copies)
    out = torch.empty((inputs["q"].shape[0], k), device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        db_sq = (s["db"].float() ** 2).sum(-1)
        scores = _mm_f32(torch, s["q"], s["db"].T)                    # (Q, N) fp32
        scores.mul_(-2.0).add_(db_sq[None, :])
        out.copy_(torch.topk(scores, k, dim=1, largest=False, sorted=True).indices)

    return PeerRun(problem, "torch mm f32 + topk", _lib(torch), run, lambda: {"idx": _host(out)}, len(sets),
                   note="materialises the (Q, N) fp32 score matrix; ||db||^2 computed in the timed run",
                   _keep=[sets, out])


# ---------------------------------------------------------------- registry

_FACTORIES: dict[str, dict[str, Callable[[str, dict[str, Any], int | None], PeerRun]]] = {
    "gemm_bf16": {"torch.matmul": _gemm_matmul, "torch.mm_f32": _gemm_mm_f32},
    "tinygemm": {"torch.matmul": _gemm_matmul, "torch.mm_f32": _gemm_mm_f32},
    "kmeans_assign": {"flash-kmeans": _assign_flash, "torch": _assign_torch},
    "kmeans_update": {"flash-kmeans-sorted": _update_flash_sorted, "flash-kmeans-unsorted": _update_flash_unsorted,
                      "torch": _update_torch},
    "knn_topk": {"torch": _knn_torch},
}
PEERS: dict[str, tuple[str, ...]] = {p: tuple(f) for p, f in _FACTORIES.items()}


def peer_names(problem: str) -> tuple[str, ...]:
    return PEERS.get(problem, ())


def _factory(problem: str, peer: str) -> Callable[[str, dict[str, Any], int | None], PeerRun]:
    if problem not in _FACTORIES:
        raise CakeError(f"no peers for problem `{problem}`; problems with peers: {', '.join(_FACTORIES)}")
    if peer not in _FACTORIES[problem]:
        raise CakeError(f"no peer `{peer}` for {problem}; its peers: {', '.join(_FACTORIES[problem])}")
    return _FACTORIES[problem][peer]


def require(problem: str, peer: str) -> None:
    """Raise :class:`PeerUnavailable` (saying what to install) unless ``peer`` can run here: torch with a CUDA
    GPU, and flash-kmeans for the peers named after it. A caller checks this before drawing any inputs."""
    _factory(problem, peer)
    if peer.startswith("flash-kmeans"):
        _flash_kmeans()
    else:
        _torch()


def make_peer(problem: str, peer: str, inputs: dict[str, Any], *, copies: int | None = None) -> PeerRun:
    """Take ``inputs`` (from ``Problem.make_inputs``: CuPy arrays, copied on the device, or numpy arrays, uploaded)
    onto the GPU and return the peer ready to run on those very values.

    ``copies``: how many device copies of the inputs to rotate among when timing; by default 4 when
    the inputs are under 64 MiB (as our kernels are timed), else 1. Raises :class:`PeerUnavailable`
    when the peer's library or a GPU is missing, ``KeyError``-free: an unknown peer is a CakeError.
    """
    make = _factory(problem, peer)
    torch = _torch()
    torch.cuda.synchronize()        # inputs drawn on another library's stream (CuPy's) are complete ...
    run = make(problem, inputs, copies)
    torch.cuda.synchronize()        # ... and so are the peer's copies of them before time_peer's stream reads them
    return run


@dataclass(frozen=True)
class PeerMeasurement:
    """A peer on one shape: ``timing`` as :func:`time_peer` returns it, and the check of its last timed run's
    outputs (``correct``, ``max_error``, ``message``; ``check``: the rows and the reference it was checked on)."""

    timing: dict[str, Any]
    correct: bool
    max_error: float
    message: str
    check: CheckInfo


def measure_peer(problem: Problem, peer: str, shape: Shape, seed: int, *, reps: int,
                 refs: ReferenceCache | None = None, rows: int | None = None) -> PeerMeasurement:
    """Time ``peer`` on ``problem``'s inputs for (``seed``, ``shape``) and check it as the gate
    checks our kernels (``runtime.gpu.check_and_time``): the same input values, drawn on the device
    (``runtime.gpu.device_reference``); the same reference, from the cache ``refs`` when a kernel was checked
    there first (the hand-written baselines at the same seed); ``rows`` random output rows of a very large
    shape (the same rows); compared on the device, at the peer's own tolerance where it has one (a bf16 C).

    Raises :class:`PeerUnavailable` before drawing anything when the peer cannot run here, ``GPURefused`` when
    the reference does not fit in GPU memory; anything else a CUDA library raises is raised as it is."""
    require(problem.name, peer)          # before any draw: a missing library costs nothing
    import cupy as cp  # noqa: PLC0415 - lazily: the module must import on CPU-only machines
    inputs, ref = device_reference(cp, problem, shape, seed, device_kind(), refs, rows)
    run = make_peer(problem.name, peer, inputs)
    try:
        t = time_peer(run, reps=reps)
        got = {n: cp.asarray(a) for n, a in run.fetch().items()}
        judged = problem if run.rtol is None else replace(problem, rtol=run.rtol)
        ok, err, msg = compare_to(judged, got, ref)
    finally:
        run.release()
    return PeerMeasurement(t, ok, err, msg, info_for(problem, shape, ref))


def time_peer(peer: PeerRun, *, reps: int = 20, warmup: int = 3, timer: str = "event") -> dict[str, Any]:
    """Median / p10 / p90 ms of ``peer.run`` with check_and_time's protocol (see the module doc).
    ``timer="graph"``: as check_and_time's graph timer, one CUDA graph (torch.cuda.CUDAGraph) of
    ``peer.copies`` back-to-back runs, each on its own input copy (make the peer with
    ``copies=cake_core.runtime.timing.graph_launches(...)``), its resets inside; ms per run.
    The last timed run's outputs stay in place for ``peer.fetch()``."""
    if timer not in TIMERS:
        raise ValueError(f"unknown timer {timer!r}: use one of {', '.join(TIMERS)}")
    torch = _torch()
    reps = max(reps, MIN_REPS)
    stream = torch.cuda.Stream()
    l2 = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")   # read, as runtime.gpu.L2Flush

    def once(r: int) -> None:
        if peer.reset:
            peer.reset()
        peer.run(r)

    per = peer.copies if timer == "graph" else 1
    with torch.cuda.stream(stream):
        for r in range(max(warmup, per)):   # every copy once before a capture: lazy set-up stays outside
            once(r)
        stream.synchronize()
        run = once
        if timer == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for r in range(per):
                    once(r)
            for _ in range(warmup):
                graph.replay()
            stream.synchronize()
            run = lambda r: graph.replay()   # noqa: E731
        # the event timer also resets the accumulators outside the timed region, before the flush
        setup = peer.reset if timer == "event" else None
        ms = time_regions(torch_clock(torch), reps, stream, lambda s: l2.sum(), run, stream.synchronize,
                          setup=setup)
    med, p10, p90 = stats([m / per for m in ms])
    return {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "runs": reps, "copies": peer.copies,
            "timer": f"{TIMERS[timer]} (torch)", "l2": L2_STATE}
