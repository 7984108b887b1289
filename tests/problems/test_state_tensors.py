"""In/out state tensors and per-output row views: a problem whose kernel reads a state and updates it in place
(s <- 0.5 s + x, the shape of a recurrent or decaying state) is checked from the state's drawn value; a kernel
that forgets the state, or never writes it back, is wrong for that reason; a spec that misuses a state is refused
in one line; an output laid out with its rows as columns is spliced and cut through its row view."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import ProblemSpecError, get_problem, registry
from cake_core.problems.base import Role, RowOracle, state

SPEC = '''
import numpy as np
from cake_core.problems import Problem, data, state
from cake_core.problems.base import RowOracle, array_module, as_sampler, bf16_round


def _inputs(s, rng):
    r = as_sampler(rng)
    return {"x": bf16_round(r.normal((s["M"], s["N"]))), "s": r.normal((s["M"], s["N"])) * 4.0}


def _decay(x, s):
    return 0.5 * s.astype(np.float64) + x.astype(np.float64)


def _rows(x, rows):
    xp = array_module(x["x"])
    return {"s": _decay(x["x"][xp.asarray(rows)], x["s"][xp.asarray(rows)])}


PROBLEM = Problem(
    name="decay", description="s <- 0.5 s + x in place; x[M,N] bf16, s[M,N] f32 state",
    dims=("M", "N"), tensors=(data("x", "bf16"), state("s", "{dtype}")),
    make_inputs=_inputs, oracle=lambda x: {"s": _decay(x["x"], x["s"])}, rtol=1e-6,
    flops=lambda s: 2.0 * s["M"] * s["N"], bytes=lambda s: 10.0 * s["M"] * s["N"],
    seed_file="decay.cake", shape_sets=("small",), {extra}
    rows=RowOracle(count=lambda s: s["M"], oracle=_rows,
                   rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["x"].shape[1])),
)
'''

SEED = '''@kernel(target="sm_90a", grid=(cdiv(M, BM),), threads=128, consts={"BM": 16, "BN": 64})
def decay(x: gmem[bf16, (M, N)], s: gmem[f32, (M, N)]):
    x_r = rmem(bf16, (BM, BN))
    s_r = rmem(f32, (BM, BN))
    keep = smem(f32, (BM, 1))
    fill(keep, value=0.5)
    sync()
    for nt in range(cdiv(N, BN)):
        load(x_r, x[tile(bid.x, BM), tile(nt, BN)])
        load(s_r, s[tile(bid.x, BM), tile(nt, BN)])
        ewise(s_r, s_r, keep, fn="mul")
        ewise(s_r, s_r, x_r, fn="add")
        store(s[tile(bid.x, BM), tile(nt, BN)], s_r)
'''

SHAPES = "M,N,role\n16,64,headline\n33,100,headline\n7,130,tail\n"


def _folder(where, dtype: str = "f32", extra: str = "", seed: str = SEED):
    folder = where / "decay"
    (folder / "kernels").mkdir(parents=True)
    (folder / "shapes").mkdir()
    (folder / "__init__.py").write_text(SPEC.replace("{dtype}", dtype).replace("{extra}", extra))
    (folder / "kernels" / "decay.cake").write_text(seed)
    (folder / "shapes" / "small.csv").write_text(SHAPES)
    return folder


@pytest.fixture
def fresh(monkeypatch):
    """A catalogue discovered anew for the test, and forgotten after it."""
    for name, value in (("_catalogue", None), ("_paths", []), ("_by_ref", {}), ("_by_name", {})):
        monkeypatch.setattr(registry, name, value)
    monkeypatch.delenv(registry.PATH_ENV, raising=False)
    return registry


@pytest.fixture
def decay(fresh, tmp_path):
    _folder(tmp_path)
    fresh.use_problem_paths([tmp_path])
    assert not fresh.catalogue().broken, [b.line() for b in fresh.catalogue().broken]
    return get_problem("decay")


def _shapes(p):
    return list(p.shape_set("small").shapes)


def test_a_state_is_both_an_input_and_an_output_and_one_parameter(decay):
    p = decay
    assert p.tensor("s").role is Role.STATE and p.states == ("s",)
    assert p.inputs == ("x", "s") and p.outputs == ("s",) and p.params == ("x", "s") and p.perturbed == "x"
    assert p.param_mismatch(["x", "s"], {"x": "bf16", "s": "f32"}) == ""
    why = p.param_mismatch(["x", "s"], {"x": "bf16", "s": "bf16"})
    assert "parameter `s` is bf16" in why and "declares it f32" in why


def test_the_gate_runs_a_state_kernel_from_the_states_drawn_value(decay):
    assert check_text(SEED, "decay.cake") == []
    result = check_stage(parse_program(SEED, "decay.cake"), decay, _shapes(decay), seed=5)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 1e-6 for v in result.value)


@pytest.mark.parametrize("case", ["forgets_the_state", "never_writes_it_back"])
def test_a_kernel_that_mishandles_the_state_is_wrong_for_that_reason(decay, case):
    text = {
        # s <- s + x: the old state is read but not decayed
        "forgets_the_state": SEED.replace('        ewise(s_r, s_r, keep, fn="mul")\n', ""),
        # the state is computed and dropped: s keeps its drawn value, finite, so only the values tell
        "never_writes_it_back": SEED.replace("        store(s[tile(bid.x, BM), tile(nt, BN)], s_r)\n", ""),
    }[case]
    assert text != SEED and check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), decay, _shapes(decay), seed=5, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert len(wrong) == len(_shapes(decay))
    assert all(v.message.startswith("s: max rel error") and v.max_error > 0.1 for v in wrong), \
        [v.message for v in wrong]


@pytest.mark.parametrize("dtype, extra, why", [
    ("i32", "", "a state tensor is a float, not i32"),
    ("f32", 'zeroed_outputs=("s",),', "state s cannot be zeroed"),
])
def test_a_spec_that_misuses_a_state_is_refused_in_one_line(fresh, tmp_path, dtype, extra, why):
    _folder(tmp_path, dtype, extra)
    fresh.use_problem_paths([tmp_path])
    broken = fresh.catalogue().broken
    assert len(broken) == 1 and why in broken[0].line() and "\n" not in broken[0].line(), \
        [b.line() for b in broken]
    assert get_problem("gemm_bf16").name == "gemm_bf16"      # the built-ins still load


def test_a_kernel_declaring_the_state_in_another_dtype_is_refused(fresh, tmp_path):
    _folder(tmp_path, seed=SEED.replace("s: gmem[f32, (M, N)]", "s: gmem[bf16, (M, N)]"))
    fresh.use_problem_paths([tmp_path])
    broken = fresh.catalogue().broken
    assert len(broken) == 1 and "parameter `s` is bf16" in broken[0].line(), [b.line() for b in broken]


def test_a_state_declared_with_an_integer_dtype_is_refused_at_once():
    with pytest.raises(ProblemSpecError, match="a state tensor is a float"):
        state("s", "i64")


def test_the_state_kernel_lowers_with_a_writable_state_and_compiles(decay, tmp_path):
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel, lower
    lr = lower(parse_program(SEED, "decay.cake"), "decay.cake")
    assert lr.ok, [d.format("decay.cake") for d in lr.diagnostics]
    src = lr.value.source
    assert "const float* __restrict__ s" not in src and "float* __restrict__ s" in src
    assert "const __nv_bfloat16* __restrict__ x" in src
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]


@pytest.mark.gpu
def test_the_state_kernel_is_checked_and_timed_on_the_gpu(decay, tmp_path):
    pytest.importorskip("cupy")
    from cake_core.lower import compile_kernel, lower
    from cake_core.runtime import gpu
    if gpu.gpu_model() is None:
        pytest.skip("no usable NVIDIA GPU here")
    shapes = [{"M": 4096, "N": 4096}, {"M": 33, "N": 100}]

    def run(text: str, time: bool):
        lr = lower(parse_program(text, "decay.cake"), "decay.cake")
        cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
        assert cr.ok, [d.message for d in cr.diagnostics]
        return gpu.check_and_time(cr.value, lr.value, decay, shapes, seed=5, time=time, reps=10)

    # timed: every timed launch updates the state; the re-check after timing starts again from its drawn value
    runs = run(SEED, True)
    assert all(r.correct and r.median_ms and r.median_ms > 0 for r in runs), [(r.shape, r.message) for r in runs]
    bad = run(SEED.replace('        ewise(s_r, s_r, keep, fn="mul")\n', ""), False)
    assert all(not r.correct and "s: max rel error" in r.message for r in bad), [r.message for r in bad]


# ---------------------------------------------------------------- per-output row views


def test_an_output_whose_rows_are_its_columns_is_cut_and_spliced_through_its_view():
    rows = RowOracle(count=lambda s: s["M"], oracle=lambda x, r: {}, views={"t": lambda a, s: a.T})
    shape = {"M": 5, "N": 3}
    t = np.arange(15, dtype=np.float32).reshape(3, 5)        # (N, M): row m of the oracle is column m
    y = np.arange(15, dtype=np.float32).reshape(5, 3)        # (M, N): the default view
    assert rows.view("t", t, shape).shape == (5, 3) and np.shares_memory(rows.view("t", t, shape), t)
    np.testing.assert_array_equal(rows.view("t", t, shape)[[1, 4]], t[:, [1, 4]].T)
    np.testing.assert_array_equal(rows.view("y", y, shape)[[1, 4]], y[[1, 4]])
    rows.view("t", t, shape)[2] = -1.0
    assert (t[:, 2] == -1.0).all() and (t[:, [0, 1, 3, 4]] >= 0).all()
    with pytest.raises(ProblemSpecError, match="row view of output `t` has 3 rows"):
        RowOracle(count=lambda s: s["M"], oracle=lambda x, r: {}, views={"t": lambda a, s: a}).view("t", t, shape)


def test_take_rows_defaults_to_the_views_and_the_gate_splices_through_them(decay):
    import dataclasses
    from cake_core.runtime.gate import _splice
    p = dataclasses.replace(decay, rows=dataclasses.replace(decay.rows, views={"s": lambda a, s: a.T}))
    shape = {"M": 4, "N": 6}
    full = np.arange(24, dtype=np.float32).reshape(6, 4)     # laid out (N, M) under this view
    np.testing.assert_array_equal(p.take_rows({"s": full}, np.array([1, 3]), shape)["s"], full[:, [1, 3]].T)
    with pytest.raises(ValueError, match="pass the shape"):
        p.take_rows({"s": full}, np.array([1]))
    spliced = _splice(p, shape, {"s": full}, {"s": -full}, np.array([2]))
    assert (spliced["s"][:, 2] == -full[:, 2]).all() and (spliced["s"][:, [0, 1, 3]] == full[:, [0, 1, 3]]).all()
