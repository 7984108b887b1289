"""trisolve: x := L^-1 x by forward substitution (the UT transform of a chunked delta rule: (I + A)^-1 with A
strictly lower-triangular). The interpreter against a float64 solve on random inputs; the verifier's refusals
(shapes, dtypes, spaces, aliasing, a role); the lowering's barriers and its call; nvcc for sm_90a.
``tests/runtime/test_trisolve_gpu.py`` (marked `gpu`) launches it against the interpreter."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def kernel(n: int, m: int, threads: int = 128, unit: bool = True, x_dtype: str = "f32", l_dtype: str = "f32",
           l_shape: str = "(N, N)", l_space: str = "smem", same: bool = False) -> str:
    """Load x (N, M) and L into shared memory, solve, store x."""
    solve = "trisolve(xs, xs" if same else "trisolve(xs, ls"
    return (f'@kernel(target="sm_90a", grid=(1,), threads={threads}, consts={{"N": {n}, "M": {m}}})\n'
            f"def solve(x: gmem[{x_dtype}, (N, M)], l: gmem[{l_dtype}, {l_shape}], y: gmem[{x_dtype}, (N, M)]):\n"
            f"    xs = smem({x_dtype}, (N, M))\n"
            f"    ls = {l_space}({l_dtype}, {l_shape})\n"
            f"    load(xs, x[tile(0, N), tile(0, M)])\n"
            f"    load(ls, l[tile(0, N), tile(0, N)])\n"
            f"    {solve}, unit={unit})\n"
            f"    store(y[tile(0, N), tile(0, M)], xs)\n")


def inputs(n: int, m: int, seed: int, unit: bool) -> dict[str, np.ndarray]:
    """A well-conditioned L: a strictly lower part of small entries (a KDA chunk's A is of this size), the diagonal
    around 1 where it is read, garbage above it (never read)."""
    rng = np.random.default_rng(seed)
    low = (rng.standard_normal((n, n)) * 0.1).astype(np.float32)
    low[np.triu_indices(n)] = rng.standard_normal(n * (n + 1) // 2).astype(np.float32) * 1e3   # never read
    if not unit:
        low[np.diag_indices(n)] = (1.0 + rng.uniform(0.5, 1.5, n)).astype(np.float32)
    return {"x": rng.standard_normal((n, m)).astype(np.float32), "l": low}


def reference(x: np.ndarray, low: np.ndarray, unit: bool) -> np.ndarray:
    L = np.tril(low.astype(np.float64), -1) + np.diag(np.ones(len(low)) if unit else np.diag(low).astype(np.float64))
    return np.linalg.solve(L, x.astype(np.float64))


@pytest.mark.parametrize("n,m,unit", [(64, 64, True), (64, 128, False), (16, 8, True), (5, 3, False)])
def test_the_interpreter_solves_as_a_float64_solve_does(n, m, unit):
    ins = inputs(n, m, n * 31 + m, unit)
    y = np.full((n, m), np.nan, np.float32)
    interp.run(parse_program(kernel(n, m, unit=unit)), {}, ins, {"y": y})
    want = reference(ins["x"], ins["l"], unit)
    assert np.abs(y - want).max() / np.abs(want).max() < 1e-5
    assert not np.allclose(y, ins["x"], atol=1e-3), "the solve changed x"


def test_the_ut_transform_of_a_chunk_is_the_inverse_of_i_plus_a():
    """x = I gives (I + A)^-1 itself: (I + A) times it is I."""
    n = 64
    rng = np.random.default_rng(5)
    a = np.tril(rng.standard_normal((n, n)) * 0.05, -1).astype(np.float32)
    y = np.full((n, n), np.nan, np.float32)
    interp.run(parse_program(kernel(n, n)), {}, {"x": np.eye(n, dtype=np.float32), "l": a}, {"y": y})
    assert np.abs((np.eye(n) + a.astype(np.float64)) @ y - np.eye(n)).max() < 1e-5


def test_a_correct_kernel_checks_clean():
    assert [d.rule for d in check_text(kernel(64, 64))] == []


@pytest.mark.parametrize("change,rule", [
    (dict(l_shape="(N, M)"), "compute.trisolve"),            # l not square
    (dict(x_dtype="bf16"), "compute.trisolve"),              # a bf16 x
    (dict(l_space="rmem"), "types.space"),                   # l in registers
    (dict(same=True), "compute.alias"),                      # l is x
])
def test_the_verifier_refuses_what_the_lowering_cannot_do(change, rule):
    n, m = (64, 32) if "l_shape" in change else (64, 64)
    rules = [d.rule for d in check_text(kernel(n, m, **change))]
    assert rule in rules, rules


def test_inside_a_role_it_is_refused_with_the_line():
    text = kernel(64, 64, threads=256).replace(
        "    trisolve(xs, ls, unit=True)\n",
        '    with role("math", warps=(0, 4)):\n        trisolve(xs, ls, unit=True)\n')
    diags = [d for d in check_text(text) if d.rule == "role.compute"]
    assert diags and "trisolve" in diags[0].message


def test_a_missing_barrier_before_it_is_not_a_race_the_lowering_fences_it():
    """Its lowering synchronises before and after (the races rule follows it so): the load right before it and the
    store right after it need no sync()."""
    r = lower(parse_program(kernel(64, 64)))
    assert r.ok, [d.message for d in r.diagnostics]
    src = "\n".join(ln for ln in r.value.source.splitlines() if not ln.startswith("#line"))
    call = "cake::trisolve_smem<64, 64, true, THREADS>(xs, ls);"
    assert call in src
    before, after = src.split(call)
    assert before.rstrip().endswith("__syncthreads();  // x and l written by other threads are visible")
    assert after.lstrip().startswith("__syncthreads();  // x solved, visible to every thread")


@needs_nvcc
@pytest.mark.parametrize("n,m,unit", [(64, 64, True), (5, 3, False)])
def test_it_compiles_for_sm_90a(tmp_path, n, m, unit):
    r = lower(parse_program(kernel(n, m, unit=unit)))
    assert r.ok
    cr = compile_kernel(r.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
