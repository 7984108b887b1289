"""CPU backend: the correctness gate on the interpreter, nothing timed.

Same protocol as the GPU gate (``runtime.gate``), on shapes small enough for numpy: inputs drawn per
(seed, shape) (never zeros), outputs poisoned with NaN before each run, comparison with the problem's
fp64 oracle (computed once per shape and seed, cached when a :class:`ReferenceCache` is given), and a
perturbation check that recomputes only the rows the changed element feeds. A shape outside the
program's domain (``ir.domain``) is refused before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cake_core.errors import CakeError
from cake_core.ir import interp
from cake_core.ir.domain import domain_violations
from cake_core.ir.expr import evaluate
from cake_core.ir.program import Program
from cake_core.ir.types import DType
from cake_core.ir.zeroing import accumulated_params
from cake_core.problems.base import Problem, Shape, input_sampler, seed_words, shape_key
from cake_core.runtime.gate import CheckInfo, compare_to, info_for, perturbation_check
from cake_core.runtime.references import ReferenceCache, reference

CPU_DEVICE = "cpu"


@dataclass(frozen=True)
class ShapeCheck:
    shape: str
    correct: bool
    max_error: float | None
    message: str
    fault: bool = False          # the program did what a GPU would fault on
    fault_line: int = 0
    refused: bool = False        # outside the program's domain: not run (the message names the bound)
    check: str = ""              # full | rows | '' (not checked)
    rows_checked: int = 0
    perturbed: str = ""          # the element the perturbation check changed and the rows it recomputed
    reference: str = ""          # where the expected outputs came from: cached | computed ...


def _poisoned(problem: Problem, program: Program, shape: Shape,
              inputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The output arrays a run writes into: poisoned (NaN), zeroed where the program accumulates into a zeroed
    output, and a state at its drawn value (the kernel reads and updates it)."""
    env = {**shape, **program.const_env}
    out = {}
    zeroed = problem.zeroed_for(accumulated_params(program))
    for name in problem.outputs:
        if name in problem.states:
            if inputs is None:
                raise ValueError(f"state `{name}` starts from its drawn value: pass the inputs")
            out[name] = np.array(inputs[name], dtype=np.float32)
            continue
        p = program.param(name)
        dims = tuple(int(evaluate(d, env)) for d in p.type.shape) if p else ()
        fill = 0.0 if name in zeroed else np.nan   # atomics accumulate into zeroed outputs
        out[name] = np.full(dims, fill, dtype=np.float32)
    return out


def _with_info(c: ShapeCheck, info: CheckInfo) -> ShapeCheck:
    return ShapeCheck(c.shape, c.correct, c.max_error, c.message, c.fault, c.fault_line, c.refused, info.check,
                      info.rows, info.perturbed, info.reference)


def check_shape_on_cpu(program: Program, problem: Problem, shape: Shape, seed: int,
                       refs: ReferenceCache | None = None) -> ShapeCheck:
    """The gate of ``program`` on one shape (see :func:`check_on_cpu`)."""
    shape = {d: int(shape[d]) for d in problem.dims}
    key = shape_key(shape)
    refused = domain_violations(program, shape)
    if refused:
        # an unguarded tile past the edge is the out-of-bounds access the interpreter (or a GPU) would fault on:
        # recorded as that fault, at its line, without running it
        oob = next((d for d in refused if d.rule == "domain.tile_multiple"), None)
        return ShapeCheck(key, False, None, "refused: " + "; ".join(d.message for d in refused), refused=True,
                          fault=oob is not None, fault_line=oob.line if oob is not None else 0)
    words = seed_words(seed, shape)
    x = problem.make_inputs(shape, input_sampler(seed, shape))
    ref = reference(problem, x, shape, seed, device=CPU_DEVICE, cache=refs)

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = _poisoned(problem, program, shape, inputs)
        interp.run(program, shape, inputs, out)
        return out

    try:
        got = run(x)
        ok, err, msg = compare_to(problem, got, ref)
        if not ok:
            return _with_info(ShapeCheck(key, False, err, msg), info_for(problem, shape, ref))
        param = program.param(problem.perturbed)
        bf16 = param is not None and param.type.dtype is DType.BF16     # inputs are bf16 values, as on the GPU
        ok2, err2, msg2, what = perturbation_check(problem, shape, x, got, ref, run, words, bf16)
    except interp.InterpFault as e:
        return _with_info(ShapeCheck(key, False, None, str(e), fault=True, fault_line=e.node.line),
                          info_for(problem, shape, ref))
    info = info_for(problem, shape, ref, what)
    if not ok2:
        return _with_info(ShapeCheck(key, False, err2, msg2), info)
    return _with_info(ShapeCheck(key, True, max(err, err2), ""), info)


def check_on_cpu(program: Program, problem: Problem, shapes: list[Shape], seed: int,
                 refs: ReferenceCache | None = None, strict: bool = False) -> list[ShapeCheck]:
    """The CPU gate of ``program`` on every shape, in order.

    Parameters
    ----------
    program, problem: the kernel and what it must compute.
    shapes: assignments of the problem's dimensions; each is drawn its own inputs from (seed, shape).
    seed: the run's seed.
    refs: the reference cache (``ReferenceCache(home / "refs")``); None recomputes the oracle per call.
    strict: also check the program's strict shapes (``runtime.strict``: rings wrapping, several tiles and
        tails in every dimension, both sides of its thresholds), after ``shapes``.

    Returns one :class:`ShapeCheck` per shape, in order (``shapes``, then the strict ones); a shape outside
    the program's domain is ``refused``, one the interpreter faults on has ``fault`` and the IR line.
    """
    todo = [{d: int(s[d]) for d in problem.dims} for s in shapes]
    if strict:
        from cake_core.runtime.strict import strict_shapes  # noqa: PLC0415 - only the strict gate needs it
        todo += [s for s, _ in strict_shapes(program, problem).beyond(todo)]
    return [check_shape_on_cpu(program, problem, shape, seed, refs) for shape in todo]


def run_file(path: str | Path, problem_name: str, shapes: list[Shape], seed: int = 0,
             refs: ReferenceCache | None = None) -> list[ShapeCheck]:
    """`cake run FILE --cpu`: parse and verify an IR file, then check it on the CPU interpreter.

    Raises CakeError with every formatted diagnostic when the file does not parse or verify, or a
    shape is outside the kernel's domain (``ir.domain``: nothing runs then), and for an unknown
    problem or a shape that does not name exactly the problem's dimensions.
    """
    from cake_core.ir.check import check_text
    from cake_core.ir.text import parse_program
    from cake_core.problems import get_problem

    problem = get_problem(problem_name)
    p = Path(path)
    if not p.is_file():
        raise CakeError(f"no IR file at {p}; pass the path of a .cake file")
    text = p.read_text()
    errors = [d for d in check_text(text, str(p)) if d.is_error]
    if errors:
        raise CakeError(f"{p} does not verify ({len(errors)} error{'s' if len(errors) > 1 else ''}):\n"
                        + "\n".join(d.format(str(p), text) for d in errors))
    for s in shapes:
        if set(s) != set(problem.dims):
            raise CakeError(f"shape {shape_key(s)} must give exactly {', '.join(problem.dims)} for problem "
                            f"{problem.name}, e.g. --shape " + ",".join(f"{d}=64" for d in problem.dims))
        if min(s.values()) < 1:
            raise CakeError(f"shape {shape_key(s)}: dimensions must be ≥ 1")
    program = parse_program(text, str(p))
    mismatch = problem.program_mismatch(program)
    if mismatch:
        raise CakeError(f"{p} does not fit problem {problem.name}: {mismatch}")
    ordered = [{d: int(s[d]) for d in problem.dims} for s in shapes]
    outside = [d for s in ordered for d in domain_violations(program, s)]
    if outside:
        raise CakeError(f"{p}: {len(outside)} shape bound{'s' if len(outside) > 1 else ''} broken; the kernel "
                        "was not run:\n" + "\n".join(d.format(str(p), text) for d in outside))
    return check_on_cpu(program, problem, ordered, seed, refs)
