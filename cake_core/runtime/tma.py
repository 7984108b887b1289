"""Host side of TMA: encode the tensor maps a lowered kernel expects (``LoweredKernel.tensor_maps``).

A kernel that uses ``tma_load`` / ``tma_store`` takes, after its pointers and its ``int`` dims, one
``const __grid_constant__ cake::tensor_map`` per :class:`~cake_core.lower.lower_async.TensorMapArg`,
by value: the 128-byte ``CUtensorMap`` that ``cuTensorMapEncodeTiled`` writes. CuPy passes it as a
128-byte numpy structured scalar (:data:`TMAP_DTYPE`, seen working on the H200: shared/gpu/README.md).

Two layers:
- :func:`tensor_map_specs` (pure, no CUDA): the driver call's arguments for every map, from the
  lowering, the shape and each array's address, and the checks the driver would otherwise fail
  with an opaque ``CUDA_ERROR_INVALID_VALUE``. The one a shape can violate is the global stride
  rule: every stride but the innermost must be a multiple of 16 bytes (bf16 rows: the inner dim a
  multiple of 8). The verifier's ``tma.global_align`` rule catches it for static dims; for symbolic
  dims :func:`refusal` names the shape and :func:`encode_tensor_maps` raises :class:`TMARefused`
  before anything is launched.
- :func:`encode_tensor_maps`: calls ``cuda.bindings.driver.cuTensorMapEncodeTiled`` (imported
  lazily, so this module imports on CPU machines) and returns the maps in kernel-argument order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from cake_core.ir.expr import c_expr, evaluate
from cake_core.ir.types import DType
from cake_core.lower.context import LoweredKernel
from cake_core.runtime.refused import GPURefused

TMAP_BYTES = 128
TMAP_DTYPE = np.dtype([("b", np.uint8, TMAP_BYTES)], align=True)
GLOBAL_ALIGN = 16          # bytes: global address and every global stride but the innermost
MAX_BOX = 256              # elements per box dimension
MAX_DIM = 1 << 32          # elements per global dimension
MAX_STRIDE = 1 << 40       # bytes

# DType -> CUtensorMapDataType member name (cuda.bindings.driver.CUtensorMapDataType)
DATA_TYPE = {DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
             DType.F32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", DType.I32: "CU_TENSOR_MAP_DATA_TYPE_INT32",
             DType.I64: "CU_TENSOR_MAP_DATA_TYPE_INT64", DType.E4M3: "CU_TENSOR_MAP_DATA_TYPE_UINT8",
             DType.E5M2: "CU_TENSOR_MAP_DATA_TYPE_UINT8", DType.BOOL: "CU_TENSOR_MAP_DATA_TYPE_UINT8"}
SWIZZLE = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
           64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}


class TMARefused(GPURefused):
    """A shape or an array the kernel's tensor maps cannot describe: refused before any launch."""


@dataclass(frozen=True)
class TensorMapSpec:
    """The arguments of one ``cuTensorMapEncodeTiled`` call, innermost dimension first."""

    name: str
    gmem: str
    data_type: str                  # CUtensorMapDataType member name
    rank: int
    global_address: int
    global_dims: tuple[int, ...]    # elements, innermost first
    global_strides: tuple[int, ...]  # bytes, rank - 1 entries (dims 1..rank-1)
    box_dims: tuple[int, ...]       # elements, innermost first
    element_strides: tuple[int, ...]
    swizzle: str                    # CUtensorMapSwizzle member name
    interleave: str = "CU_TENSOR_MAP_INTERLEAVE_NONE"
    l2_promotion: str = "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"
    oob_fill: str = "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"   # zeros past the edge: the IR's semantics


def _param(lowered: LoweredKernel, name: str):
    for p in lowered.params:
        if p.name == name:
            return p
    raise TMARefused(f"tensor map refers to `{name}`, which is not a parameter of {lowered.kernel_name}")


def _global_shape(lowered: LoweredKernel, name: str, shape: Mapping[str, int]) -> tuple[int, ...]:
    env = {**dict(lowered.consts), **shape}
    return tuple(int(evaluate(d, env)) for d in _param(lowered, name).shape)


def _shape_text(shape: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in shape.items()) + "}"


def refusal(lowered: LoweredKernel, shape: Mapping[str, int]) -> str | None:
    """Why this shape cannot run through the kernel's tensor maps, or None when it can.

    Checks what depends on the shape alone (no arrays): every global stride but the innermost a
    multiple of 16 bytes, and dims in the driver's range. A kernel without tensor maps never refuses.
    """
    for m in lowered.tensor_maps:
        p = _param(lowered, m.gmem)
        dims = _global_shape(lowered, m.gmem, shape)
        for d, e in zip(dims, p.shape):
            if not 0 < d <= MAX_DIM:
                return (f"shape {_shape_text(shape)}: dimension {c_expr(e)} = {d} of `{m.gmem}` is outside "
                        f"1..2^32, which a TMA tensor map cannot describe")
        for k in range(1, len(dims)):
            stride = math.prod(dims[k:]) * m.dtype.bytes
            if stride % GLOBAL_ALIGN:
                inner = " * ".join(c_expr(e) for e in p.shape[k:])
                per = GLOBAL_ALIGN // math.gcd(GLOBAL_ALIGN, m.dtype.bytes)
                return (f"shape {_shape_text(shape)}: `{m.gmem}` ({m.dtype.value}, {tuple(dims)}) has a global stride of "
                        f"{stride} B ({inner} = {math.prod(dims[k:])} elements); TMA needs every global stride a "
                        f"multiple of {GLOBAL_ALIGN} B, i.e. {inner} % {per} == 0 for {m.dtype.value}. "
                        "Refused before launch: pad that dimension, or run a kernel that reads "
                        "it with load()/cp_async() instead of tma_load()")
    return None


def tensor_map_specs(lowered: LoweredKernel, addresses: Mapping[str, int],
                     shape: Mapping[str, int]) -> list[TensorMapSpec]:
    """The encode arguments of every tensor map of ``lowered``, in kernel-argument order.

    ``addresses`` maps each gmem parameter a map names to its device address (the array must be
    C-contiguous with the parameter's shape: the strides are derived from the shape). Raises
    :class:`TMARefused` for a shape :func:`refusal` refuses, a misaligned address, or a box the
    hardware cannot copy.
    """
    why = refusal(lowered, shape)
    if why:
        raise TMARefused(why)
    out = []
    for m in lowered.tensor_maps:
        if m.dtype not in DATA_TYPE:
            raise TMARefused(f"tensor map `{m.name}`: no TMA data type for {m.dtype.value}")
        if m.swizzle not in SWIZZLE:
            raise TMARefused(f"tensor map `{m.name}`: swizzle {m.swizzle} B is not one of 0/32/64/128")
        if m.gmem not in addresses:
            raise TMARefused(f"tensor map `{m.name}` needs the device address of `{m.gmem}`")
        addr = int(addresses[m.gmem])
        if addr % GLOBAL_ALIGN:
            raise TMARefused(f"tensor map `{m.name}`: `{m.gmem}` starts at {addr:#x}, not {GLOBAL_ALIGN}-byte aligned")
        dims = _global_shape(lowered, m.gmem, shape)
        if len(m.box) != len(dims) or not 1 <= len(dims) <= 5:
            raise TMARefused(f"tensor map `{m.name}`: box {m.box} does not match `{m.gmem}` of rank {len(dims)} "
                             "(TMA takes rank 1..5)")
        box = tuple(reversed(m.box))
        inner_bytes = box[0] * m.dtype.bytes
        if any(not 1 <= b <= MAX_BOX for b in box) or inner_bytes % 16 or (m.swizzle and inner_bytes > m.swizzle):
            raise TMARefused(f"tensor map `{m.name}`: box {m.box} cannot be copied by TMA (each dim 1..{MAX_BOX}, "
                             f"inner {inner_bytes} B a multiple of 16" + (f" and at most the {m.swizzle} B swizzle span"
                                                                          if m.swizzle else "") + ")")
        gd = tuple(reversed(dims))
        strides = tuple(math.prod(gd[:k]) * m.dtype.bytes for k in range(1, len(gd)))
        if any(s >= MAX_STRIDE for s in strides):
            raise TMARefused(f"tensor map `{m.name}`: `{m.gmem}` is too large for a TMA stride (< 2^40 B)")
        out.append(TensorMapSpec(m.name, m.gmem, DATA_TYPE[m.dtype], len(gd), addr, gd, strides, box,
                                 (1,) * len(gd), SWIZZLE[m.swizzle]))
    return out


def _driver():
    from cuda.bindings import driver  # noqa: PLC0415 - lazily: the module must import on CPU-only machines
    return driver


_initialised = False


def encode_spec(spec: TensorMapSpec, driver: Any = None) -> np.void:
    """One ``cuTensorMapEncodeTiled`` call: the 128-byte map as a :data:`TMAP_DTYPE` scalar."""
    global _initialised
    drv = driver if driver is not None else _driver()
    if not _initialised and driver is None:
        drv.cuInit(0)          # the encode needs the driver initialised (CuPy has usually done it)
        _initialised = True
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    res = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, spec.data_type), spec.rank, spec.global_address,
        [u64(d) for d in spec.global_dims], [u64(s) for s in spec.global_strides],
        [u32(b) for b in spec.box_dims], [u32(e) for e in spec.element_strides],
        getattr(drv.CUtensorMapInterleave, spec.interleave), getattr(drv.CUtensorMapSwizzle, spec.swizzle),
        getattr(drv.CUtensorMapL2promotion, spec.l2_promotion),
        getattr(drv.CUtensorMapFloatOOBfill, spec.oob_fill))
    err, tmap = res[0], res[1]
    if err != drv.CUresult.CUDA_SUCCESS:
        raise TMARefused(f"cuTensorMapEncodeTiled refused `{spec.name}` ({spec.gmem}: dims {spec.global_dims}, "
                         f"strides {spec.global_strides} B, box {spec.box_dims}, {spec.swizzle}): {err}")
    return pack_words([int(w) for w in tmap.opaque])


def pack_words(words: list[int]) -> np.void:
    """16 little-endian 64-bit words → the 128-byte structured scalar CuPy passes by value."""
    if len(words) != TMAP_BYTES // 8:
        raise ValueError(f"a CUtensorMap is {TMAP_BYTES // 8} words, got {len(words)}")
    buf = np.zeros((), dtype=TMAP_DTYPE)
    buf["b"] = np.asarray(words, dtype="<u8").view(np.uint8)
    return buf[()]


def _address(arr: Any, name: str, dims: tuple[int, ...]) -> int:
    if tuple(int(d) for d in arr.shape) != dims:
        raise TMARefused(f"`{name}` has shape {tuple(arr.shape)}, its tensor map expects {dims}")
    flags = getattr(arr, "flags", None)
    if flags is not None and not flags.c_contiguous:
        raise TMARefused(f"`{name}` is not C-contiguous: its tensor map assumes row-major strides")
    data = getattr(arr, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(arr.data_ptr())


def encode_tensor_maps(lowered: LoweredKernel, device_arrays: Mapping[str, Any], shape: Mapping[str, int],
                       driver: Any = None) -> list[np.void]:
    """The kernel's tensor-map arguments for these device arrays (CuPy, or anything with
    ``.data.ptr`` / ``.data_ptr()``), one 128-byte scalar per ``lowered.tensor_maps`` entry, in order.

    Raises :class:`TMARefused` (a :class:`GPURefused`) with the reason when a map cannot be made:
    the caller launches nothing then. ``driver`` replaces ``cuda.bindings.driver`` (tests).
    """
    if not lowered.tensor_maps:
        return []
    why = refusal(lowered, shape)
    if why:
        raise TMARefused(why)
    addresses = {}
    for m in lowered.tensor_maps:
        if m.gmem not in device_arrays:
            raise TMARefused(f"tensor map `{m.name}` needs the device array `{m.gmem}`")
        addresses[m.gmem] = _address(device_arrays[m.gmem], m.gmem, _global_shape(lowered, m.gmem, shape))
    return [encode_spec(s, driver) for s in tensor_map_specs(lowered, addresses, shape)]
