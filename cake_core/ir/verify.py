"""The verifier: every rule of the rule modules, every diagnostic collected.

The rule modules each keep a :class:`~cake_core.ir.rule_ctx.RuleSet`; they are assembled here, in this
order, into :data:`RULES` (rule ids are unique). ``verify`` builds the symbol table once (``Ctx``), runs
every rule, and returns all diagnostics sorted by line. Learned rules (anything with
``diagnose(program, shapes) -> [Diagnostic]``: ``cake_core.harness.learned.LearnedRule``) come from approved
harness versions and run beside the built-in ones.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from cake_core.ir import (rules, rules_async, rules_async_copy, rules_cluster, rules_compute, rules_let,
                          rules_operands, rules_sync, rules_topk, rules_wgmma)
from cake_core.ir.program import Program
from cake_core.ir.rule_ctx import (Ctx, Rule, build_ctx, fmt_shape, rmem_words_per_thread, same_extent,  # noqa: F401
                                   smem_bytes, view_extent)
from cake_core.outcome import Diagnostic, Severity
from cake_core.targets import find_arch, known_archs

__all__ = ["RULES", "LearnedCheck", "verify", "Ctx", "Rule", "build_ctx", "fmt_shape", "rmem_words_per_thread",
           "same_extent", "smem_bytes", "view_extent"]


def _assemble(*modules: Any) -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for m in modules:
        for r in m.RULESET.rules:
            if r.id in out:
                raise AssertionError(f"rule `{r.id}` is defined twice ({out[r.id].check.__module__}, "
                                     f"{r.check.__module__})")
            out[r.id] = r
    return out


RULES: dict[str, Rule] = _assemble(rules_operands, rules, rules_async, rules_async_copy, rules_wgmma, rules_compute,
                                    rules_topk, rules_cluster, rules_let, rules_sync)


class LearnedCheck(Protocol):
    """A rule from an approved harness version (``cake_core.harness.learned.LearnedRule``)."""

    id: str

    def diagnose(self, program: Program, shapes: Sequence[dict[str, int]]) -> list[Diagnostic]: ...


def verify(program: Program, target: str | None = None,
           learned: Sequence[LearnedCheck] = (), shapes: Sequence[dict[str, int]] = ()) -> list[Diagnostic]:
    """All diagnostics of ``program`` (built-in rules, then learned rules), sorted by line.

    ``shapes``, when given (the run's shape set), lets shape rules name a witness shape.
    """
    name = target or program.target
    arch = find_arch(name)
    if arch is None:
        return [Diagnostic("target.unknown", Severity.ERROR, f"unknown target `{name}`", program.line, 1, "",
                           f"known targets: {', '.join(known_archs())}")]
    ctx = build_ctx(program, arch)
    ctx.shapes = tuple(shapes)
    ctx.rules = RULES
    out: list[Diagnostic] = []
    # the protocol checker's simulation is the one costly rule: it runs last, and on a program another rule has
    # already refused it spends a smaller step budget (check_protocol)
    for r in RULES.values():
        if r.family != "protocol":
            out.extend(r.check(ctx))
    ctx.refused = any(d.severity is Severity.ERROR for d in out)
    for r in RULES.values():
        if r.family == "protocol":
            out.extend(r.check(ctx))
    for lr in learned:
        out.extend(lr.diagnose(program, ctx.shapes))
    return sorted(out, key=lambda d: (d.line, d.col, d.rule))
