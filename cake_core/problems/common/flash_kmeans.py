"""The flash-kmeans library (Triton kernels), imported only when a peer that uses it is made."""
from __future__ import annotations

from cake_core.problems.peer import PeerUnavailable, torch_cuda

VERSION = "0.3.1"       # the wheel the GPU machine carries


def flash_kmeans():
    """(assign module, update module, library text), or PeerUnavailable saying how to install it."""
    torch_cuda()
    try:   # the Triton modules themselves: the package's __init__ silently falls back to torch without Triton
        import flash_kmeans  # noqa: PLC0415
        from flash_kmeans import assign_euclid_triton, centroid_update_triton  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(
            f"flash-kmeans (with its Triton kernels) does not import here ({type(e).__name__}: {e}). It is a "
            f"pure-Python wheel: `pip download --no-deps flash-kmeans=={VERSION}` where pip works, "
            "carry the wheel, `pip install --no-deps --target DIR` it and put DIR on PYTHONPATH") from None
    version = getattr(flash_kmeans, "__version__", "?")
    return assign_euclid_triton, centroid_update_triton, f"flash-kmeans {version}"
