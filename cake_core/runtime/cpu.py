"""CPU backend: the correctness gate on the interpreter, nothing timed.

Same protocol as the GPU gate, on shapes small enough for numpy: fresh seeded
inputs per shape (never zeros), outputs poisoned with NaN before the run,
comparison with the problem's fp64 oracle, and a perturbation check (change
one input element, run again, the output must follow the oracle).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cake_core.errors import CakeError
from cake_core.ir import interp
from cake_core.ir.expr import evaluate
from cake_core.ir.program import Program
from cake_core.ir.types import DType
from cake_core.ir.zeroing import accumulated_params
from cake_core.ir.numeric import bf16_round
from cake_core.problems.base import Problem, Shape, shape_key


@dataclass(frozen=True)
class ShapeCheck:
    shape: str
    correct: bool
    max_error: float | None
    message: str
    fault: bool = False          # the program did what a GPU would fault on
    fault_line: int = 0


def _poisoned(problem: Problem, program: Program, shape: Shape) -> dict[str, np.ndarray]:
    env = {**shape, **program.const_env}
    out = {}
    zeroed = problem.zeroed_for(accumulated_params(program))
    for name in problem.outputs:
        p = program.param(name)
        dims = tuple(int(evaluate(d, env)) for d in p.type.shape) if p else ()
        fill = 0.0 if name in zeroed else np.nan   # atomics accumulate into zeroed outputs
        out[name] = np.full(dims, fill, dtype=np.float32)
    return out


def _run_once(problem: Problem, program: Program, shape: Shape, x: dict[str, np.ndarray]):
    out = _poisoned(problem, program, shape)
    interp.run(program, shape, x, out)
    return problem.compare(out, problem.oracle(x))


def check_on_cpu(program: Program, problem: Problem, shapes: list[Shape], seed: int) -> list[ShapeCheck]:
    results = []
    for i, shape in enumerate(shapes):
        rng = np.random.default_rng([seed, i])
        x = problem.make_inputs(shape, rng)
        key = shape_key(shape)
        try:
            ok, err, msg = _run_once(problem, program, shape, x)
            if ok:
                # perturbation: a changed input must change the output as the oracle says
                name = problem.inputs[0]
                x2 = {k: v.copy() for k, v in x.items()}
                flat = x2[name].reshape(-1)
                j = int(rng.integers(flat.size))
                flat[j] = flat[j] + 2.0 if flat[j] < 0 else flat[j] - 2.0
                param = program.param(name)
                if param is not None and param.type.dtype is DType.BF16:
                    x2[name] = bf16_round(x2[name])      # inputs are bf16 values, as on the GPU
                ok2, err2, msg2 = _run_once(problem, program, shape, x2)
                if not ok2:
                    ok, err, msg = False, err2, f"after perturbing {name}[{j}]: {msg2}"
        except interp.InterpFault as e:
            results.append(ShapeCheck(key, False, None, str(e), fault=True, fault_line=e.node.line))
            continue
        results.append(ShapeCheck(key, ok, err, "" if ok else msg))
    return results


def run_file(path: str | Path, problem_name: str, shapes: list[Shape], seed: int = 0) -> list[ShapeCheck]:
    """`cake run FILE --cpu`: parse and verify an IR file, then check it on the CPU interpreter.

    Raises CakeError with every formatted diagnostic when the file does not parse or verify,
    and for an unknown problem or a shape that does not name exactly the problem's dimensions.
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
    mismatch = problem.param_mismatch([q.name for q in program.params])
    if mismatch:
        raise CakeError(f"{p} does not fit problem {problem.name}: {mismatch}")
    ordered = [{d: int(s[d]) for d in problem.dims} for s in shapes]
    return check_on_cpu(program, problem, ordered, seed)
