"""The Cake IR reference, generated from the registries (op declarations, verifier rules, dtypes, memory
spaces, targets). People read it as ``docs/ops.md``; the LLM agent reads the same text.

    python -m cake_core.ir.reference > docs/ops.md

Ops are grouped by their declared family, in the order of the ``Op`` enum; each lists its operands
(kind, effect, memory spaces), attributes, form, preconditions and the rules that guard it (a rule says
which ops it guards); a rule that guards no op is listed under "General rules".
"""
from __future__ import annotations

from cake_core.ir.opdef import Effect, Operand
from cake_core.ir.ops import REGISTRY, AttrSpec, Op, OpDef
from cake_core.ir.types import DType, MemSpace
from cake_core.ir.verify import RULES
from cake_core.targets import get_arch, known_archs

_KINDS = {
    "dtype": "a dtype name (bf16, f32, ...)",
    "shape": "a tuple of index expressions, e.g. (BM, BK)",
    "buf": "the name of an smem/rmem tile (or a gmem parameter where the op allows it)",
    "cond": "one comparison of two index expressions, e.g. `kt < cdiv(K, BK) - 1`",
    "view": "a window of a gmem parameter: `a[tile(i, n), :, j]`; `tile(i, n, base=b, limit=l)` starts at "
            "b + i * n and ends at l where l comes before the tensor's edge (loads read zeros past it, stores skip "
            "it; not for TMA copies): a chunk of a sequence at any offset, `x[tile(c, BT, base=bos, limit=eos), :]`",
    "expr": "an index expression (ints, consts, dims, loop variables, bid.x/y/z, ncta.x/y/z (the grid's CTA "
            "counts), + - * // %, cdiv/min/max); a grid may also use num_sms (the GPU's SM count, given at launch)",
    "name": "a new name the op binds: a loop variable (`for`), or a binding visible to the rest of the block "
            "(`let`, written `name = expr`; the names other ops bind)",
    "slot": "a buffer name, or a ring slot `name[expr]` of a staged smem tile or an mbarrier array",
    "str": "a string literal naming something (a role)",
    "warps": "a pair of integer literals `(lo, hi)`: warps lo..hi-1",
}


def rules_for(op: Op) -> list[str]:
    """The rules that guard ``op``, by id."""
    return sorted(rid for rid, r in RULES.items() if op in r.guards)


def _operand(o: Operand, d: OpDef) -> str:
    kw = " (written `name=...`)" if o.keyword else ""
    what = []
    effects = [e for e in o.effects if e is not Effect.NONE]
    if effects:
        what.append(" or ".join(dict.fromkeys(e.value for e in effects)))
    if o.memory and o.space:
        what.append("/".join(s.value for s in o.space))
    if o.barrier is not None:
        what.append(f"an mbarrier: {d.op.value} {o.barrier.value}")
    if o.binds is not None:
        what.append(f"a name it binds, visible in {o.binds.value}")
    if o.index:
        what.append("indices")
    if o.predicate:
        what.append("a condition: nonzero is true")
    if o.cluster:
        what.append("exchanged with the cluster")
    return f"- `{o.name}`: {o.kind}{kw}" + (f" ({'; '.join(what)})" if what else "")


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
    if d.operands:
        out.append("Operands:")
        out += [_operand(o, d) for o in d.operands]
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
    for name in known_archs():
        a = get_arch(name)
        out.append(f"| `{name}` | {a.family} | {'yes' if a.runs_here else 'compile-only'} | "
                   f"{a.max_threads_per_cta} | {a.smem_per_cta_bytes} | "
                   f"{a.max_regs_per_thread} | {', '.join(a.mma_atoms)} |")
    return out


def render_reference() -> str:
    """The whole reference as Markdown (deterministic: a test compares it with docs/ops.md)."""
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
    used = sorted({o.kind for d in REGISTRY.values() for o in d.operands})
    out += [f"- `{k}`: {_KINDS.get(k, 'see the ops that use it')}" for k in used] + [""]
    out += ["## Dtypes", "", "| dtype | bytes | float | C type |", "|---|---|---|---|"]
    out += [f"| `{d.value}` | {d.bytes} | {'yes' if d.is_float else 'no'} | `{d.c_type}` |" for d in DType] + [""]
    out += ["## Memory spaces", ""]
    doc = (MemSpace.__doc__ or "").split("\n")
    out += [" ".join(x.strip() for x in doc if x.strip()), ""]
    out += [f"- `{m.value}`" for m in MemSpace] + [""]
    out += ["## Targets", ""] + _targets() + [""]
    out += ["## Ops", ""]
    order = list(dict.fromkeys(REGISTRY[op].family for op in Op))
    for fam in order:
        out += [f"## Family: {fam.value}", ""]
        for op in Op:
            if REGISTRY[op].family is fam:
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
