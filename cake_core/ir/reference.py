"""The Cake IR reference, generated from the registries (ops, verifier rules, dtypes, memory
spaces, targets). People read it as ``docs/ops.md``; the LLM agent reads the same text.

    python -m cake_core.ir.reference > docs/ops.md

Op families are the ``# -- family`` comment headers of the ``Op`` enum. The rules that
guard an op are those listed for it in ``RULE_OPS`` plus those whose id starts with the
op's name (``mma.shape`` guards ``mma``); a rule that guards no op is listed under
"General rules".
"""
from __future__ import annotations

import inspect
import re

from cake_core.ir import ops as ops_mod
from cake_core.ir.ops import REGISTRY, AttrSpec, Op, OpDef
from cake_core.ir.targets import known_targets, load_target
from cake_core.ir.types import DType, MemSpace
from cake_core.ir.verify import RULES

_C, _A = ("fill", "cast", "unary", "ewise", "transpose", "reduce", "scan", "argmin", "argmax", "argmin_update",
          "topk_merge"), ("atomic_add", "scatter_add")
_G = ("gather_add",)

# rule id -> the ops it guards (by op value), for rules whose id does not name the op
RULE_OPS: dict[str, tuple[str, ...]] = {
    "types.undefined": ("load", "store", "mma"),
    "types.redefined": ("smem", "rmem", "for"),
    "types.space": ("load", "store", "mma"),
    "types.view_rank": ("load", "store"),
    "types.dtype": ("load", "mma"),
    "shapes.extent": ("load", "store"),
    "shapes.static": ("smem", "rmem"),
    "shapes.symbols": ("load", "store", "for"),
    "shapes.launch_symbols": ("for",),
    "control.loop_step": ("for",),
    "resources.smem": ("smem",),
    "resources.registers": ("rmem",),
    "resources.rmem_split": ("rmem",),
    "races.smem": ("load", "store", "mma", "sync", "fill", "atomic_add", "scatter_add", "gather_add", "cp_async"),
    "compute.undefined": _C + _A + _G,
    "compute.space": _C + _A + _G,
    "compute.shape": ("cast", "unary", "scan", "transpose"),
    "compute.broadcast": ("ewise",),
    "compute.axis": ("reduce", "scan", "argmin", "argmax"),
    "compute.reduce_shape": ("reduce", "argmin", "argmax", "argmin_update", "topk_merge"),
    "compute.index_dtype": ("argmin", "argmax", "argmin_update", "topk_merge", "scatter_add", "gather_add"),
    "compute.dtype": ("unary", "ewise", "argmin_update", "topk_merge"),
    "compute.alias": ("transpose", "reduce", "argmin", "argmax", "argmin_update", "topk_merge"),
    "compute.scratch_smem": ("ewise", "transpose", "reduce", "scan", "argmin", "argmax", "argmin_update",
                             "topk_merge", "scatter_add"),
    "atomic.space": _A,
    "atomic.dtype": _A,
    "atomic.shape": _A,
    "atomic.smem_target": ("scatter_add",),
    "atomic.owner": ("scatter_add",),
    "gather.target": _G,
    "gather.source": _G,
    "gather.queue": _G,
}

_KINDS = {
    "dtype": "a dtype name (bf16, f32, ...)",
    "shape": "a tuple of index expressions, e.g. (BM, BK)",
    "buf": "the name of an smem/rmem tile (or a gmem parameter where the op allows it)",
    "view": "a window of a gmem parameter: `a[tile(i, n), :, j]`",
    "expr": "an index expression (ints, consts, dims, loop variables, bid.x/y/z, ncta.x/y/z (the grid's CTA "
            "counts), + - * // %, cdiv/min/max); a grid may also use num_sms (the GPU's SM count, given at launch)",
    "name": "a new name: a loop variable (`for`) or a binding (`let`, written `name = expr`)",
    "slot": "a buffer name, or a ring slot `name[expr]` of a staged smem tile or an mbarrier array",
    "str": "a string literal naming something (a role)",
    "warps": "a pair of integer literals `(lo, hi)`: warps lo..hi-1",
}


def op_families() -> dict[Op, str]:
    """Each op's family: the ``# -- family`` header above it in the ``Op`` enum."""
    src = inspect.getsource(ops_mod.Op)
    fam, out = "other", {}
    by_name = {o.name: o for o in Op}
    for line in src.splitlines():
        m = re.match(r"\s*# -- (\S[^(;]*)", line)
        if m:
            fam = m.group(1).strip()
            continue
        m = re.match(r"\s*([A-Z0-9_]+)\s*=", line)
        if m and m.group(1) in by_name:
            out[by_name[m.group(1)]] = fam
    return out


def rules_for(op: Op) -> list[str]:
    ids = [r for r, ops in RULE_OPS.items() if op.value in ops and r in RULES]
    ids += [r for r in RULES if r.split(".")[0] == op.value and r not in ids]
    return sorted(ids)


def _attr(name: str, a: AttrSpec) -> str:
    default = a.default
    if isinstance(default, float) and default in (float("inf"), float("-inf")):
        shown = "inf" if default > 0 else "-inf"
    elif isinstance(default, str):
        shown = f'"{default}"'
    else:
        shown = repr(default)
    choices = f"; one of {', '.join(repr(c) if not isinstance(c, str) else chr(34) + c + chr(34) for c in a.choices)}" \
        if a.choices else ""
    return f"- `{name}`: {a.kind.__name__}, default `{shown}`{choices}"


def _op(d: OpDef) -> list[str]:
    out = [f"### `{d.op.value}`", "", d.summary, ""]
    if d.example:
        out += ["```python", d.example, "```", ""]
    kinds = []
    if d.operands:
        out.append("Operands:")
        for name, kind in d.operands:
            kw = " (written `name=...`)" if name in d.keyword_operands else ""
            out.append(f"- `{name}`: {kind}{kw}")
            kinds.append(kind)
        out.append("")
    if d.attrs:
        out.append("Attributes:")
        out += [_attr(k, a) for k, a in d.attrs.items()]
        out.append("")
    flags = [f for f, on in (("binds a result (`x = op(...)`)", d.result), ("opens a block", d.block)) if on]
    if flags:
        out += ["Form: " + "; ".join(flags) + ".", ""]
    if d.preconditions:
        out.append("Preconditions:")
        out += [f"- {p}" for p in d.preconditions]
        out.append("")
    guards = rules_for(d.op)
    if guards:
        out += ["Verifier rules: " + ", ".join(f"`{r}`" for r in guards), ""]
    return out


def _targets() -> list[str]:
    out = ["| target | family | runs here | threads/CTA | smem/CTA (B) | regs/thread | MMA atoms |",
           "|---|---|---|---|---|---|---|"]
    for arch in known_targets():
        t = load_target(arch) or {}
        out.append(f"| `{arch}` | {t.get('family', '')} | {'yes' if t.get('runs_here') else 'compile-only'} | "
                   f"{t.get('max_threads_per_cta', '')} | {t.get('smem_per_cta_bytes', '')} | "
                   f"{t.get('max_regs_per_thread', '')} | {', '.join(t.get('mma_atoms', []))} |")
    return out


def render_reference() -> str:
    """The whole reference as Markdown (deterministic: a test compares it with docs/ops.md)."""
    fams = op_families()
    out = ["# Cake IR reference", "",
           "Generated by `python -m cake_core.ir.reference` from the op registry, the verifier rules and the "
           "target data; do not edit by hand.", "",
           "All tile ops are CTA-collective and destination-first. An rmem tile is distributed over the CTA's "
           "threads: element e of the flattened tile lives in thread e % threads.", "",
           "## The kernel header", "",
           "`@kernel(target=\"sm_90a\", grid=(...), threads=N, ctas_per_sm=C, consts={...})`, keywords only:", "",
           "- `target`: the architecture (see Targets).",
           "- `grid`: 1 to 3 index expressions over the problem's dims, the consts and `num_sms`.",
           "- `threads`: threads per CTA, an integer literal (a multiple of 32).",
           "- `ctas_per_sm` (optional): how many CTAs must fit on one SM together; the compiler caps the "
           "registers per thread at the register file / (C x threads). Not with setmaxnreg roles, which take "
           "the SM alone.",
           "- `consts`: named integer constants, a dict literal.", "",
           "## Operand kinds", ""]
    used = sorted({k for d in REGISTRY.values() for _, k in d.operands})
    out += [f"- `{k}`: {_KINDS.get(k, 'see the ops that use it')}" for k in used] + [""]
    out += ["## Dtypes", "", "| dtype | bytes | float | C type |", "|---|---|---|---|"]
    out += [f"| `{d.value}` | {d.bytes} | {'yes' if d.is_float else 'no'} | `{d.c_type}` |" for d in DType] + [""]
    out += ["## Memory spaces", ""]
    doc = (MemSpace.__doc__ or "").split("\n")
    out += [" ".join(x.strip() for x in doc if x.strip()), ""]
    out += [f"- `{m.value}`" for m in MemSpace] + [""]
    out += ["## Targets", ""] + _targets() + [""]
    out += ["## Ops", ""]
    order: list[str] = []
    for op in Op:
        f = fams.get(op, "other")
        if f not in order:
            order.append(f)
    for fam in order:
        members = [op for op in Op if fams.get(op, "other") == fam and op in REGISTRY]
        if not members:
            continue
        out += [f"## Family: {fam}", ""]
        for op in members:
            out += _op(REGISTRY[op])
    guarded = {r for op in REGISTRY for r in rules_for(op)}
    out += ["## Verifier rules", "", "| rule | family | severity | guards | summary |", "|---|---|---|---|---|"]
    for rid in sorted(RULES):
        r = RULES[rid]
        ops = [op.value for op in REGISTRY if rid in rules_for(op)]
        out.append(f"| `{rid}` | {r.family} | {r.severity.value} | {', '.join(ops) or '—'} | {r.summary} |")
    out += ["", "## General rules", "",
            "Rules that guard no single op (resources, target, whole-program checks):", ""]
    out += [f"- `{rid}` ({RULES[rid].family}): {RULES[rid].summary}" for rid in sorted(RULES) if rid not in guarded]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render_reference(), end="")
