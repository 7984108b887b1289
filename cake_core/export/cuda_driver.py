"""The CUDA driver calls an exported package makes, through ctypes on libcuda: nothing else is needed.

``cake export`` copies this file into every package it writes (``<pkg>/cuda_driver.py``), beside the
``__init__.py`` made from ``dispatcher_template.py``; it imports the standard library only. One
:class:`Driver` per process: ``cuInit`` once, the primary context of each device retained once, modules
loaded from the cubin bytes (``cuModuleLoadData``), launches through ``cuLaunchKernel`` (a cluster kernel's
dimensions are compiled into its cubin as ``__cluster_dims__``, so the classic launch runs it), zeroing with
``cuMemsetD32Async``/``cuMemsetD8Async`` on the launch's stream, tensor maps by ``cuTensorMapEncodeTiled``.
Every failure is a :class:`CudaError` of one line that names the call and CUDA's error name.
"""
from __future__ import annotations

import ctypes
import sys

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
TMAP_BYTES = 128            # sizeof(CUtensorMap)
TMAP_ALIGN = 128            # alignas(128) in cuda.h
# the enum members a manifest names (cuda.h: CUtensorMapDataType, ...Swizzle, ...L2promotion, ...FloatOOBfill)
TMAP_ENUMS = {
    "CU_TENSOR_MAP_DATA_TYPE_UINT8": 0, "CU_TENSOR_MAP_DATA_TYPE_INT32": 3, "CU_TENSOR_MAP_DATA_TYPE_INT64": 5,
    "CU_TENSOR_MAP_DATA_TYPE_FLOAT16": 6, "CU_TENSOR_MAP_DATA_TYPE_FLOAT32": 7, "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16": 9,
    "CU_TENSOR_MAP_INTERLEAVE_NONE": 0,
    "CU_TENSOR_MAP_SWIZZLE_NONE": 0, "CU_TENSOR_MAP_SWIZZLE_32B": 1, "CU_TENSOR_MAP_SWIZZLE_64B": 2,
    "CU_TENSOR_MAP_SWIZZLE_128B": 3,
    "CU_TENSOR_MAP_L2_PROMOTION_NONE": 0, "CU_TENSOR_MAP_L2_PROMOTION_L2_64B": 1,
    "CU_TENSOR_MAP_L2_PROMOTION_L2_128B": 2, "CU_TENSOR_MAP_L2_PROMOTION_L2_256B": 3,
    "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE": 0,
}

_P, _U32, _I32, _U64, _SZ = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
_SIGNATURES = {     # name -> argtypes (every call returns CUresult, an int)
    "cuInit": (_U32,),
    "cuDeviceGet": (ctypes.POINTER(_I32), _I32),
    "cuDeviceGetName": (ctypes.c_char_p, _I32, _I32),
    "cuDeviceGetAttribute": (ctypes.POINTER(_I32), _I32, _I32),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_P), _I32),
    "cuCtxGetCurrent": (ctypes.POINTER(_P),),
    "cuCtxSetCurrent": (_P,),
    "cuModuleLoadData": (ctypes.POINTER(_P), ctypes.c_char_p),
    "cuModuleGetFunction": (ctypes.POINTER(_P), _P, ctypes.c_char_p),
    "cuFuncSetAttribute": (_P, _I32, _I32),
    "cuLaunchKernel": (_P, _U32, _U32, _U32, _U32, _U32, _U32, _U32, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)),
    "cuMemsetD8Async": (_U64, ctypes.c_ubyte, _SZ, _P),
    "cuMemsetD32Async": (_U64, _U32, _SZ, _P),
    "cuTensorMapEncodeTiled": (_P, _I32, _U32, _P, ctypes.POINTER(_U64), ctypes.POINTER(_U64),
                               ctypes.POINTER(_U32), ctypes.POINTER(_U32), _I32, _I32, _I32, _I32),
    "cuGetErrorName": (_I32, ctypes.POINTER(ctypes.c_char_p)),
}


class CudaError(Exception):
    """A CUDA driver call failed (or libcuda is missing): one line naming the call and the error."""


def _library() -> ctypes.CDLL:
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CudaError(f"the CUDA driver library ({' or '.join(names)}) was not found: install the NVIDIA driver")


def aligned_tmap() -> tuple[ctypes.Array, int]:
    """A host buffer for one CUtensorMap and its 128-byte aligned address (keep the buffer alive)."""
    raw = ctypes.create_string_buffer(TMAP_BYTES + TMAP_ALIGN)
    return raw, (ctypes.addressof(raw) + TMAP_ALIGN - 1) // TMAP_ALIGN * TMAP_ALIGN


class Driver:
    """libcuda, initialised once; the primary context of each device it has been asked for."""

    def __init__(self) -> None:
        lib = _library()
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self.lib = lib
        self.contexts: dict[int, int] = {}
        self.check(lib.cuInit(0), "cuInit")

    def check(self, result: int, call: str) -> None:
        if result:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise CudaError(f"{call} failed: {(name.value or b'CUDA error').decode()} ({result})")

    def device_name(self, ordinal: int) -> str:
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        buf = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
        return buf.value.decode(errors="replace")

    def sm_count(self, ordinal: int) -> int:
        v = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal),
                   "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        return v.value

    def use_device(self, ordinal: int) -> None:
        """Make the primary context of ``ordinal`` current on this thread (the one torch and CuPy use)."""
        ctx = self.contexts.get(ordinal)
        if ctx is None:
            handle = ctypes.c_void_p()
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), ordinal), "cuDevicePrimaryCtxRetain")
            ctx = self.contexts[ordinal] = handle.value
        cur = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if cur.value != ctx:
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def function(self, cubin: bytes, kernel_name: str, smem_bytes: int, static_limit: int) -> int:
        """Load ``cubin`` into the current context and return ``kernel_name``'s handle, allowed ``smem_bytes`` of
        dynamic shared memory (past ``static_limit``, 48 KiB, a kernel must opt in)."""
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, kernel_name.encode()),
                   f"cuModuleGetFunction({kernel_name})")
        if smem_bytes > static_limit:
            self.check(self.lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                       f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem_bytes})")
        return fn.value

    def encode_tmap(self, address: int, spec: dict, dims: list[int], strides: list[int], box: list[int],
                    out_address: int) -> None:
        """``cuTensorMapEncodeTiled`` into the 128-byte map at ``out_address`` (dims, strides, box innermost first)."""
        rank = len(dims)
        u64, u32 = _U64 * rank, _U32 * rank
        e = TMAP_ENUMS
        self.check(self.lib.cuTensorMapEncodeTiled(
            out_address, e[spec["data_type"]], rank, address, u64(*dims), (_U64 * max(rank - 1, 1))(*strides),
            u32(*box), u32(*([1] * rank)), e[spec["interleave"]], e[spec["swizzle"]], e[spec["l2_promotion"]],
            e[spec["oob_fill"]]), f"cuTensorMapEncodeTiled({spec['name']}: dims {dims}, strides {strides} B, box {box})")

    def memset_zero(self, address: int, nbytes: int, stream: int) -> None:
        if nbytes % 4 == 0 and address % 4 == 0:
            self.check(self.lib.cuMemsetD32Async(address, 0, nbytes // 4, stream), "cuMemsetD32Async")
        else:
            self.check(self.lib.cuMemsetD8Async(address, 0, nbytes, stream), "cuMemsetD8Async")

    def launch(self, fn: int, grid: tuple[int, int, int], threads: int, smem_bytes: int, stream: int,
               params: ctypes.Array) -> None:
        r = self.lib.cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes, stream, params, None)
        if r:
            self.check(r, "cuLaunchKernel")
