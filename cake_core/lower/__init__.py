"""Cake IR → CUDA C++ (``cuda.lower``) and nvcc → cubin (``compile.compile_kernel``)."""
from cake_core.lower.compile import Compiled, Resources, compile_kernel
from cake_core.lower.cuda import LOWERINGS, KernelArg, LoweredKernel, LowerError, lower

__all__ = ["Compiled", "Resources", "compile_kernel", "LOWERINGS", "KernelArg", "LoweredKernel", "LowerError",
           "lower"]
