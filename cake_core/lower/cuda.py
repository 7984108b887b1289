"""Cake IR → one CUDA C++ translation unit (sm_90a first), with ``#line`` maps to the IR.

The kernel is written onto ``header/cake.cuh`` (our own device header). Every
line of generated code is preceded by ``#line N "<ir file>"`` naming the IR
statement it came from, so an nvcc error lands on the IR line that caused it.

Each op has one entry in :data:`~cake_core.lower.dispatch.LOWERINGS` (a test checks that every declared op
has one), with named variants where it lowers differently by context. A hook takes the node and the
lowering context (``context.Ctx``) and returns the C++ lines of that statement; it raises
:class:`LowerError` when it cannot lower the node, which becomes a ``COMPILE_FAILED`` diagnostic at the
node's IR line. All diagnostics of a program are collected, not just the first.

What is lowered in v1 (and what is not, with its rule id):
- allocation and the CTA-wide tile ops (smem, rmem, load, store, sync, mma per atom, the mma_sync
  fragment layout): ``lower_tile``; ``for``, ``if`` and ``let``: ``lower_control``;
- the async vocabulary: roles, mbarriers, TMA, cp.async: ``lower_async``; wgmma and its accumulators,
  argmin_bias: ``lower_wgmma``; topk_bias, sqnorm_rows and the top-k cluster merge: ``lower_topk``; split-K over a
  cluster: ``lower_cluster``; split-K with atomics from a wgmma accumulator: ``lower_splitk``;
- the compute ops: ``lower_compute``.
A grid that uses ``num_sms`` is evaluated at launch with the GPU's SM count
(``LoweredKernel.grid_for(shape, num_sms)``).
"""

from __future__ import annotations

from cake_core.ir.expr import LAUNCH_SYMBOLS, Bin, Call, Expr, Sym, symbols
from cake_core.ir.program import Program, walk
from cake_core.ir.smem_layout import smem_layout
from cake_core.ir.zeroing import accumulated_params
from cake_core.lower.context import Buf, Ctx, KernelArg, LoweredKernel, LowerError  # noqa: F401 - the products
from cake_core.lower.dispatch import LOWERINGS
from cake_core.lower.lower_async import kernel_extras
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.targets import find_arch, known_archs

__all__ = ["lower", "LoweredKernel", "KernelArg", "LowerError", "LOWERINGS", "HEADER_NAME"]

HEADER_NAME = "cake.cuh"
STAGE = "lower"

# Names the generated code uses for itself, and C++ keywords an IR name must not shadow.
_RESERVED = {
    "THREADS", "cake", "cake_smem", "cake_cdiv", "cake_min", "cake_max", "threadIdx", "blockIdx",
    "blockDim", "gridDim", "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch",
    "char", "class", "const", "constexpr", "continue", "default", "delete", "do", "double", "else", "enum",
    "explicit", "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int", "long",
    "mutable", "namespace", "new", "not", "operator", "or", "private", "protected", "public", "register",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw",
    "true", "try", "typedef", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
    "while", "xor", "half", "dim3",
}


# --------------------------------------------------------------------- driver

def _dims(p: Program) -> tuple[str, ...]:
    seen: list[str] = []
    for q in p.params:
        for d in q.type.shape:
            for s in _ordered_symbols(d):
                if s not in seen and s not in p.const_env:
                    seen.append(s)
    return tuple(seen)


def _ordered_symbols(e: Expr) -> list[str]:
    if isinstance(e, Sym):
        return [e.name]
    if isinstance(e, Bin):
        return _ordered_symbols(e.a) + _ordered_symbols(e.b)
    if isinstance(e, Call):
        return [s for a in e.args for s in _ordered_symbols(a)]
    return []


def _names(p: Program) -> list[tuple[str, int]]:
    out = [(p.name, p.line)] + [(q.name, q.line or p.line) for q in p.params] + [(k, p.line) for k, _ in p.consts]
    for w in walk(p.body):
        n = w[0]
        if n.result:
            out.append((n.result, n.line))
        out += [(a, n.line) for o, a in zip(n.decl.operands, n.args) if o.binds is not None]
    return out


def lower(program: Program, ir_filename: str = "kernel.cake") -> StageResult:
    """Lower a (verified) program to CUDA C++.

    Returns a ``StageResult`` of stage ``lower``: ``OK`` with a
    :class:`LoweredKernel` as ``value`` and the source as artifact ``kernel.cu``,
    or ``COMPILE_FAILED`` with every lowering diagnostic at its IR line.
    """
    arch = find_arch(program.target)
    if arch is None:
        return StageResult(STAGE, Outcome.COMPILE_FAILED, [Diagnostic(
            "lower.unknown_target", Severity.ERROR, f"no target data for `{program.target}`", program.line, 0,
            "kernel", f"known targets: {', '.join(known_archs())}; Cake never lowers for another architecture")])
    dims = _dims(program)
    gmem = {q.name: Buf(q.name, q.type, ()) for q in program.params}
    ctx = Ctx(program, ir_filename, dims, gmem, arch, LOWERINGS, smem=smem_layout(program, arch))
    ctx.paths = {id(w[0]): w[1] for w in walk(program.body)}
    for name, line in _names(program):
        if name in _RESERVED or name.startswith("__") or name.startswith("cake_"):
            ctx.diags.append(Diagnostic("lower.reserved_name", Severity.ERROR,
                                        f"`{name}` is reserved in the generated CUDA", line, 0, "",
                                        "rename it"))
    for g in program.grid:
        unknown = sorted(symbols(g) - set(program.const_env) - set(dims) - set(LAUNCH_SYMBOLS))
        if unknown:
            ctx.diags.append(Diagnostic("lower.unknown_name", Severity.ERROR,
                                        f"grid uses `{unknown[0]}`, which is neither a const nor a problem dimension",
                                        program.line, 0, "kernel.grid"))
    body = ctx.lower_block(program.body)
    if any(d.is_error for d in ctx.diags):
        return StageResult(STAGE, Outcome.COMPILE_FAILED, ctx.diags)

    # a parameter that some op's view operand writes or adds into (store, atomics, tma_store, cluster stores)
    written = {a.buf for n, _, _ in walk(program.body) for o, a in zip(n.decl.operands, n.args)
               if o.kind == "view" and o.effect_of(n).modifies}
    args = tuple(KernelArg(q.name, q.type.dtype, q.type.shape, q.name in written) for q in program.params)
    sig = [f"{'' if a.written else 'const '}{a.dtype.c_type}* __restrict__ {a.name}" for a in args]
    sig += [f"int {d}" for d in dims]
    tmap_sig, kattrs, tmaps, cluster = kernel_extras(ctx)
    sig += tmap_sig
    # setmaxnreg needs a register cap at entry: one CTA per SM; ctas_per_sm=N caps the registers so that N fit
    setmaxnreg = ctx.__dict__.get("async_state", {}).get("setmaxnreg")
    if setmaxnreg and program.ctas_per_sm > 1:
        return StageResult(STAGE, Outcome.COMPILE_FAILED, ctx.diags + [Diagnostic(
            "lower.ctas_per_sm", Severity.ERROR, f"ctas_per_sm={program.ctas_per_sm} with setmaxnreg roles: they need "
            "one CTA per SM", program.line, 0, "kernel", hint="drop ctas_per_sm or the roles' regs=")])
    bounds = f"{program.threads}, 1" if setmaxnreg else \
        f"{program.threads}, {program.ctas_per_sm}" if program.ctas_per_sm else f"{program.threads}"
    f = f'"{ir_filename}"'
    src = [f"// generated by cake_core.lower.cuda from {ir_filename}; program {program.name} ({program.hash})",
           f'#include "{HEADER_NAME}"', "",
           f"#line {program.line or 1} {f}",
           f"extern \"C\" __global__ void {kattrs}__launch_bounds__({bounds}) {program.name}(" + ", ".join(sig) + ") {",
           f"#line {program.line or 1} {f}",
           f"    constexpr int THREADS = {program.threads};"]
    for k, v in program.consts:
        src += [f"#line {program.line or 1} {f}", f"    constexpr int {k} = {v};"]
    if tmaps:   # the descriptors' fetch overlaps the barrier set-up instead of delaying the first copy
        src += [f"#line {program.line or 1} {f}",
                "    if (threadIdx.x == THREADS - 1) { " + " ".join(f"cake::prefetch_tensor_map(&{m.name});"
                                                             for m in tmaps) + " }"]
    if ctx.smem_top:
        src += [f"#line {program.line or 1} {f}",
                f"    extern __shared__ __align__({arch.tma.swizzle_smem_align_bytes}) unsigned char cake_smem[];"]
    for line, text in body:
        src += [f"#line {line} {f}", text]
    src.append("}")
    source = "\n".join(src) + "\n"
    smem = ctx.smem.total       # what the verifier checked against the target's limit
    lk = LoweredKernel(source, program.name, smem, program.threads, args, dims, program.grid,
                       program.consts, program.target, ir_filename, tmaps, cluster, accumulated_params(program))
    return StageResult(STAGE, Outcome.OK, ctx.diags, {"smem_bytes": smem, "source_lines": len(src)},
                       {"kernel.cu": source}, lk)
