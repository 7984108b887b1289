"""The corpus gate: replay the whole kernel corpus under a proposed harness before anyone approves it.

The corpus (:func:`corpus`): every hand-written kernel in a problem's ``kernels/``, every problem's naive
seed, and the best passing attempts of every problem from the warehouse. Each kernel is replayed on its
problem's gate shapes (:func:`gate_shapes`: small enough for the interpreter, never held out) and on its
own strict shapes (:func:`kernel_shapes`: ``runtime.strict``, its rings wrapping, several tiles and a tail
in every dimension, both sides of its thresholds) through
parse (with the harness's composites expanded), the verifier (built-in rules, then the harness's learned
rules) and the interpreter, and on the GPU when a ``gpu`` checker is given. A shape the built-in rules
refuse is outside the kernel's domain and not replayed. A kernel that passes a shape under the current
harness and fails it under the proposed one is a *flip*; one flip refuses the proposal.

The report (plain JSON-able data) also says what the change would have caught or gained: for a rule, the
failing attempts of the warehouse it stops before they ran (and the GPU-seconds they cost), and every
passing attempt it would stop (a flip too); for a primitive, that each kernel containing the pattern,
written with the composite, expands back to itself and passes as before; for a calibration, the rank
quality and error of the model before and after, on all and on held-out attempts; for a macro tactic,
what applying it to the seeds and best attempts makes.

Verifier and interpreter results are cached by (IR hash, shape, seed) in a :class:`GateCache`, shared by
every proposal of one review: the built-in verdicts and the interpreter do not depend on the harness. With a
:class:`~cake_core.harness.gate_store.GateStore` they are kept on disk too, for the reviews of later processes.
"""
from __future__ import annotations

import math
import statistics
import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import TACTICS
from cake_core.harness import calibration as cal
from cake_core.harness.composite import Composite, contract, windows
from cake_core.harness.gate_store import GateStore
from cake_core.harness.macro import Macro, chain
from cake_core.harness.proposal import Proposal
from cake_core.harness.records import AttemptRecord
from cake_core.harness.version import HarnessSpec
from cake_core.ir.program import Program
from cake_core.ir.text import ParseResult, parse
from cake_core.ir.verify import verify
from cake_core.model.base import geomean
from cake_core.outcome import Diagnostic
from cake_core.problems import get_problem, list_problems
from cake_core.problems.base import Problem, Shape, shape_key
from cake_core.runtime.cpu import ShapeCheck, check_on_cpu
from cake_core.runtime.strict import strict_shapes

ORIGINS = ("hand-written", "seed", "best-attempt")
BEST_PER_PROBLEM = 3
SHAPES_PER_PROBLEM = 4
MACRO_TRIES = 3          # rng seeds a macro is applied with, per kernel

# gpu(program, problem, shapes, seed) -> one (correct, message) per shape
GpuCheck = Callable[[Program, Problem, list[Shape], int], list[tuple[bool, str]]]


@dataclass(frozen=True)
class Kernel:
    name: str           # <problem>/kernels/<file>.cake, or attempt:<id>
    origin: str         # hand-written | seed | best-attempt
    problem: str
    text: str


def kernel_problem(filename: str) -> str | None:
    """The problem whose ``kernels/`` holds the kernel file ``filename`` (None: no problem's)."""
    for p in list_problems():
        if (p.kernels_dir / filename).is_file():
            return p.name
    return None


def corpus(best: Sequence[AttemptRecord] = (), per_problem: int = BEST_PER_PROBLEM) -> list[Kernel]:
    """The gate's corpus: every kernel file of every problem's ``kernels/`` (its naive seed and its hand-written
    programs) and the ``per_problem`` best passing attempts of each problem (lowest score first, one per IR hash,
    none that is a kernel file's text)."""
    out = []
    for prob in list_problems():
        for f in prob.kernel_files():
            out.append(Kernel(f"{prob.name}/kernels/{f}", "seed" if f == prob.seed_file else "hand-written",
                              prob.name, prob.kernel_text(f)))
    files = {k.text for k in out}
    by_problem: dict[str, list[AttemptRecord]] = {}
    for a in sorted((a for a in best if a.passed and a.score is not None), key=lambda a: a.score):
        picked = by_problem.setdefault(a.problem, [])
        if len(picked) < per_problem and a.ir_hash not in {b.ir_hash for b in picked} and a.ir_text not in files:
            picked.append(a)
    for rows in by_problem.values():
        out += [Kernel(f"attempt:{a.attempt_id}", "best-attempt", a.problem, a.ir_text) for a in rows]
    return out


def gate_shapes(problem: Problem, limit: int = SHAPES_PER_PROBLEM) -> list[Shape]:
    """Shapes of the problem's shape sets small enough for the interpreter, never held out: the smallest
    headline shape of each set, then the smallest tail shape (a ragged edge), at most ``limit``."""
    heads, tails = [], []
    for name in problem.shape_sets:
        ss = problem.shape_set(name)
        small = [(s, r) for s, r in zip(ss.shapes, ss.roles) if max(s.values()) <= problem.cpu_limit
                 and r != "held_out"]
        h = sorted((s for s, r in small if r == "headline"), key=lambda s: math.prod(s.values()))
        if h and h[0] not in heads:
            heads.append(h[0])
        tails += [s for s, r in small if r == "tail"]
    tail = sorted((s for s in tails if s not in heads), key=lambda s: math.prod(s.values()))
    return (heads + tail[:1])[:limit]


def kernel_shapes(k: Kernel, problem: Problem, harness: HarnessSpec,
                  cache: "GateCache | None" = None) -> list[tuple[Shape, bool]]:
    """The shapes ``k`` is replayed on: the problem's gate shapes, then the kernel's strict shapes
    (``runtime.strict.strict_shapes`` of its program, composites expanded under ``harness``) that are not
    among them; each with whether it is a strict one. A kernel that does not parse has the gate shapes only
    (its replay says why it fails)."""
    shapes = [(s, False) for s in gate_shapes(problem)]
    text = harness.expand(k.text).text
    prog = (cache.parse(text) if cache is not None else parse(text)).program
    if prog is not None:
        given = [s for s, _ in shapes]
        shapes += [(s, True) for s, _ in strict_shapes(prog, problem).beyond(given)]
    return shapes


@dataclass
class GateCache:
    """Harness-independent results of one review: built-in diagnostics and interpreter (and GPU) checks; with a
    ``store``, the first two are also read from and kept on disk for later processes."""

    builtin: dict[tuple[str, str], tuple[Diagnostic, ...]] = field(default_factory=dict)
    checks: dict[tuple[str, str, str, int], ShapeCheck] = field(default_factory=dict)
    gpu: dict[tuple[str, str, str, int], tuple[bool, str]] = field(default_factory=dict)
    parsed: dict[str, ParseResult] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    store: GateStore | None = None     # results kept on disk across processes (gate_store), when given

    def parse(self, text: str) -> ParseResult:
        """The parse of an (expanded) kernel text: a review replays each text on every shape under every
        proposal, and parsing is a third of a replay's cost. Results are only read, never changed."""
        r = self.parsed.get(text)
        if r is None:
            r = self.parsed[text] = parse(text)
        return r

    def verify(self, program: Program, shape: Shape) -> tuple[Diagnostic, ...]:
        key = (program.hash, shape_key(shape))
        store = self.store
        return self._memo(self.builtin, key, lambda: tuple(verify(program, shapes=[shape])),
                          store.diagnostics if store else None, store.keep_diagnostics if store else None)

    def check(self, program: Program, problem: Problem, shape: Shape, seed: int) -> ShapeCheck:
        key = (program.hash, problem.name, shape_key(shape), seed)
        store = self.store if problem.source == "built-in" else None     # another's oracle is not fingerprinted
        return self._memo(self.checks, key, lambda: check_on_cpu(program, problem, [shape], seed)[0],
                          store.check if store else None, store.keep_check if store else None)

    def _memo(self, memo: dict, key: tuple, compute: Callable[[], Any], kept: Callable | None,
              keep: Callable | None) -> Any:
        """``memo[key]``, else what the store kept, else computed (and kept)."""
        if key in memo:
            self.hits += 1
            return memo[key]
        value = kept(key) if kept else None
        if value is not None:
            self.hits += 1
        else:
            self.misses += 1
            value = compute()
            if keep:
                keep(key, value)
        memo[key] = value
        return value


@dataclass(frozen=True)
class Verdict:
    passed: bool
    stage: str          # ok | domain | parse | verify | check | gpu
    reason: str = ""


def verdict(text: str, problem: Problem, shape: Shape, harness: HarnessSpec, cache: GateCache, seed: int = 0,
            gpu: GpuCheck | None = None) -> Verdict:
    """How one kernel text fares on one shape under ``harness``."""
    exp = harness.expand(text)
    if exp.diagnostics:
        d = exp.diagnostics[0]
        return Verdict(False, "parse", f"{d.rule}: {d.message}")
    r = cache.parse(exp.text)
    bad = next((d for d in r.diagnostics if d.is_error), None)
    if r.program is None or bad is not None:
        return Verdict(False, "parse", f"{bad.rule}: {bad.message}" if bad else "does not parse")
    prog = r.program
    bad = next((d for d in cache.verify(prog, shape) if d.is_error), None)
    if bad is not None:
        return Verdict(False, "domain", f"{bad.rule}: {bad.message}")
    for lr in harness.learned_rules:
        hit = lr.diagnose(prog, [shape])
        if hit:
            return Verdict(False, "verify", f"{lr.id}: {hit[0].message}")
    chk = cache.check(prog, problem, shape, seed)
    if chk.refused and not chk.fault:       # outside the kernel's domain: never run, neither wrong nor passing
        return Verdict(False, "domain", chk.message)
    if not chk.correct:
        return Verdict(False, "check", ("fault: " if chk.fault else "wrong: ") + chk.message)
    if gpu is not None:
        key = (prog.hash, problem.name, shape_key(shape), seed)
        if key not in cache.gpu:
            cache.gpu[key] = gpu(prog, problem, [shape], seed)[0]
        ok, msg = cache.gpu[key]
        if not ok:
            return Verdict(False, "gpu", msg)
    return Verdict(True, "ok")


def replay(kernels: Sequence[Kernel], current: HarnessSpec, proposed: HarnessSpec, cache: GateCache, seed: int = 0,
           gpu: GpuCheck | None = None) -> dict[str, Any]:
    """Every kernel on every gate shape of its problem and its own strict shapes (:func:`kernel_shapes`), under
    both harnesses: the flips and a summary (``strict_replays``: the replays on strict shapes)."""
    flips, outside, failing_today = [], [], []
    replays = strict_replays = 0
    for k in kernels:
        problem = get_problem(k.problem)
        in_domain = 0
        for s, strict in kernel_shapes(k, problem, current, cache):
            today = verdict(k.text, problem, s, current, cache, seed, gpu)
            if today.stage == "domain":
                continue
            in_domain += 1
            if not today.passed:
                failing_today.append({"kernel": k.name, "shape": shape_key(s), "strict": strict, "why": today.reason})
                continue
            replays += 1
            strict_replays += strict
            after = verdict(k.text, problem, s, proposed, cache, seed, gpu)
            if not after.passed:
                flips.append({"kernel": k.name, "origin": k.origin, "problem": k.problem, "shape": shape_key(s),
                              "strict": strict, "stage": after.stage, "why": after.reason})
        if in_domain == 0:
            outside.append(k.name)
    counts = {o: sum(k.origin == o for k in kernels) for o in ORIGINS}
    return {"kernels": len(kernels), **counts, "replays": replays, "strict_replays": strict_replays, "flips": flips,
            "outside_every_gate_shape": outside, "failing_today": failing_today}


# ------------------------------------------------------------------ what a change catches or gains

def _new_rules(current: HarnessSpec, proposed: HarnessSpec):
    have = {r.id for r in current.learned_rules}
    return [r for r in proposed.learned_rules if r.id not in have]


def rule_effect(current: HarnessSpec, proposed: HarnessSpec, failures: Sequence[AttemptRecord],
                passing: Sequence[AttemptRecord], cluster: Sequence[str]) -> dict[str, Any]:
    """Failures the new rules would have stopped before they ran, and passing attempts they would stop."""
    rules = _new_rules(current, proposed)

    def hit(a: AttemptRecord) -> bool:
        return a.program is not None and any(r.diagnose(a.program, a.shapes) for r in rules)
    caught = [a for a in failures if a.stage != "verify" and hit(a)]
    blocked = [a for a in passing if hit(a)]
    in_cluster = set(cluster)
    by_outcome: dict[str, int] = {}
    for a in caught:
        by_outcome[a.outcome] = by_outcome.get(a.outcome, 0) + 1
    return {"caught": len(caught), "failures_read": len(failures),
            "cluster_caught": sum(a.attempt_id in in_cluster for a in caught), "cluster_size": len(in_cluster),
            "gpu_seconds": round(sum(a.gpu_seconds for a in caught), 6), "by_outcome": by_outcome,
            "caught_examples": [a.attempt_id for a in caught[:5]],
            "passing_read": len(passing), "passing_blocked": [a.attempt_id for a in blocked]}


def primitive_effect(proposed: HarnessSpec, comp: Composite, kernels: Sequence[Kernel], cache: GateCache,
                     seed: int = 0, gpu: GpuCheck | None = None) -> dict[str, Any]:
    """Each corpus kernel holding the pattern, written with the composite: does it expand back to itself,
    and pass its gate and strict shapes as before?"""
    key, size = comp.key(), len(comp.body)
    rows = []
    for k in kernels:
        prog = cache.parse(k.text).program
        if prog is None or not any(o.key() == key for o in windows(prog, range(size, size + 1))):
            continue
        text = contract(prog, [comp])
        back = cache.parse(proposed.expand(text).text).program
        same = back is not None and back == prog and text != prog.text()
        problem = get_problem(k.problem)
        shapes = []
        for s, _ in kernel_shapes(k, problem, proposed, cache):
            if not verdict(k.text, problem, s, proposed, cache, seed, gpu).passed:
                continue        # outside its domain, or failing today: written with the composite, no flip
            v = verdict(text, problem, s, proposed, cache, seed, gpu)
            shapes.append({"shape": shape_key(s), "passed": v.passed, "why": v.reason})
        rows.append({"kernel": k.name, "origin": k.origin, "round_trip": same,
                     "calls": text.count(f"{comp.name}("), "lines_saved": len(prog.text().splitlines())
                     - len(text.splitlines()), "shapes": shapes})
    return {"kernels_with_pattern": len(rows), "kernels": rows,
            "round_trip_failures": [r["kernel"] for r in rows if not r["round_trip"]]}


def calibration_effect(current: HarnessSpec, proposed: HarnessSpec, samples: Sequence[cal.Sample]) -> dict[str, Any]:
    """The model's quality before and after, on every measured sample and on the held-out ones."""
    before, after = current.cost_model(), proposed.cost_model()
    _, held = cal.split(samples)
    return {"samples": len(samples), "held_out": len(held),
            "all": {"before": cal.quality(before, samples), "after": cal.quality(after, samples)},
            "held_out_quality": {"before": cal.quality(before, held), "after": cal.quality(after, held)},
            "predictions_changed": cal.changed(before, after, samples),
            "rank_quality_change": _delta(cal.quality(before, held)["rank_correlation"],
                                          cal.quality(after, held)["rank_correlation"])}


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 4)


def macro_effect(proposed: HarnessSpec, macro: Macro, kernels: Sequence[Kernel], cache: GateCache,
                 tactics: dict, seed: int = 0) -> dict[str, Any]:
    """The macro applied to the seeds and best attempts: how many children it makes, how many pass their
    gate shapes, and the cost model's speed-up of those (hand-written kernels are not rewritten)."""
    tactic = chain(macro, tactics)
    model = proposed.cost_model()
    made = passed = 0
    speedups = []
    per_problem: dict[str, dict[str, int]] = {}
    for k in kernels:
        if k.origin == "hand-written":
            continue
        prog = cache.parse(proposed.expand(k.text).text).program
        if prog is None:
            continue
        problem = get_problem(k.problem)
        shapes = gate_shapes(problem)
        row = per_problem.setdefault(k.problem, {"applied": 0, "passed": 0})
        bounds = {d: max(s[d] for s in shapes) for d in problem.dims}
        for t in range(MACRO_TRIES):
            try:
                child = tactic(prog, np.random.default_rng([seed, t]), bounds=bounds)
            except Refused:         # a step's precondition does not hold here: the macro does not apply
                continue
            if child is None or child == prog:
                continue
            made += 1
            row["applied"] += 1
            verdicts = [verdict(child.text(), problem, s, proposed, cache, seed) for s in shapes]
            if any(v.stage == "domain" for v in verdicts) or not all(v.passed for v in verdicts):
                continue
            passed += 1
            row["passed"] += 1
            b, a = model.predict_ms(prog, shapes), model.predict_ms(child, shapes)
            speedups.append(geomean(x / y for x, y in zip(b, a)))
    return {"children": made, "children_passing": passed, "per_problem": per_problem,
            "predicted_speedup_median": round(statistics.median(speedups), 4) if speedups else None}


# ------------------------------------------------------------------ the gate

def run_gate(proposal: Proposal, current: HarnessSpec, kernels: Sequence[Kernel], cache: GateCache | None = None,
             *, failures: Sequence[AttemptRecord] = (), passing: Sequence[AttemptRecord] = (),
             cluster: Sequence[str] = (), samples: Sequence[cal.Sample] = (), tactics: dict | None = None,
             seed: int = 0, gpu: GpuCheck | None = None) -> dict[str, Any]:
    """Replay the corpus under ``current`` with ``proposal`` applied.

    Parameters
    ----------
    proposal : Proposal
        The change; its payload must apply to ``current`` (else HarnessDataError).
    current : HarnessSpec
        The harness the corpus passes today.
    kernels : sequence of Kernel
        The corpus (:func:`corpus`).
    cache : GateCache, optional
        Harness-independent results to reuse.
    failures, passing : sequence of AttemptRecord
        The warehouse's failing and passing attempts with their runs' shapes (rule proposals).
    cluster : sequence of str
        The attempt ids of the proposal's cluster.
    samples : sequence of Sample
        Measured samples (calibration proposals).
    tactics : dict, optional
        The tactic table a macro chains (tactic proposals; the agent's built-in table by default).
    seed : int
        Seeds the interpreter's inputs.
    gpu : GpuCheck, optional
        A GPU correctness check run after the interpreter.

    Returns
    -------
    dict
        Plain JSON-able data: ``passed``, ``refusals``, ``flips`` (kernel, shape, why), ``corpus`` (counts,
        replays, kernels outside every gate shape or failing today), ``caught`` (rules) or ``gained``
        (the other kinds), ``seconds`` and the cache's hits.
    """
    t0 = _time.monotonic()
    cache = cache if cache is not None else GateCache()
    proposed = current.apply(proposal.kind, proposal.payload, current.version + 1)
    report: dict[str, Any] = {"kind": proposal.kind, "base_version": current.version, "gpu": gpu is not None}
    report["corpus"] = replay(kernels, current, proposed, cache, seed, gpu)
    flips = list(report["corpus"]["flips"])
    refusals = []
    if proposal.kind == "rule":
        eff = rule_effect(current, proposed, failures, passing, cluster)
        report["caught"] = eff
        flips += [{"kernel": f"attempt:{a}", "origin": "passing-attempt", "why": "blocked by the new rule"}
                  for a in eff["passing_blocked"]]
        if eff["caught"] == 0:
            refusals.append("the rule would have stopped no failure that reached a later stage")
    elif proposal.kind == "primitive":
        comp = proposed.composites[-1]
        eff = primitive_effect(proposed, comp, kernels, cache, seed, gpu)
        report["gained"] = eff
        if eff["round_trip_failures"]:
            refusals.append(f"written with `{comp.name}`, {', '.join(eff['round_trip_failures'])} no longer "
                            "expand to the same kernel")
        flips += [{"kernel": r["kernel"], "origin": r["origin"], "shape": s["shape"], "why": s["why"]}
                  for r in eff["kernels"] for s in r["shapes"] if not s["passed"]]
    elif proposal.kind == "calibration":
        eff = calibration_effect(current, proposed, samples)
        report["gained"] = eff
        hb, ha = (eff["held_out_quality"][w]["median_abs_log_error"] for w in ("before", "after"))
        if eff["predictions_changed"] == 0:
            refusals.append("the refit changes no prediction")
        elif hb is not None and ha is not None and ha > hb:
            refusals.append("the refit predicts held-out attempts worse")
    elif proposal.kind == "tactic" and "macro" in proposal.payload:
        table = proposed.tactics(TACTICS if tactics is None else tactics)
        macro = proposed.macros[-1]
        if macro.name in table:
            report["gained"] = macro_effect(proposed, macro, kernels, cache, table, seed)
        else:
            refusals.append(f"the macro's steps {', '.join(macro.steps)} are not all tactics of the agent")
    if flips:
        refusals.insert(0, f"{len(flips)} kernel(s) that pass today would fail")
    report["flips"] = flips
    report["passed"] = not refusals
    report["refusals"] = refusals
    report["seconds"] = round(_time.monotonic() - t0, 3)
    report["cache"] = {"hits": cache.hits, "misses": cache.misses}
    return report


def gpu_check(cache_dir: Path) -> GpuCheck:
    """A GPU correctness check for the gate (lower, compile with nvcc, run the correctness gate untimed).

    Needs nvcc and a CUDA GPU; a kernel that faults poisons the process's CUDA context, so run a gate
    that uses it in a worker that can be replaced.
    """
    from cake_core.lower.compile import compile_kernel
    from cake_core.lower.cuda import lower
    from cake_core.outcome import Outcome
    from cake_core.runtime.gpu import check_and_time

    def run(program: Program, problem: Problem, shapes: list[Shape], seed: int) -> list[tuple[bool, str]]:
        low = lower(program, "gate.cake")
        if low.outcome is not Outcome.OK:
            return [(False, f"lowering failed: {low.diagnostics[0].message if low.diagnostics else ''}")] * len(shapes)
        comp = compile_kernel(low.value, arch=program.target, cache_dir=cache_dir)
        if comp.outcome is not Outcome.OK:
            return [(False, f"compile failed: {comp.diagnostics[0].message if comp.diagnostics else ''}")] * len(shapes)
        runs = check_and_time(comp.value, low.value, problem, shapes, seed=seed, time=False)
        return [(r.correct, r.message) for r in runs]
    return run
