"""The example problem outside Cake (examples/problems/rmsnorm, the running example of docs/new-problem.md): found
through a problem path, its naive seed right on the interpreter (tails included) and compiled by nvcc, the gate
refusing planted wrong kernels for the right reason, and `cake evolve` running it end to end on the CPU."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem, registry
from warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "problems"
FOLDER = EXAMPLES / "rmsnorm"
SEED = FOLDER / "kernels" / "rmsnorm.cake"


def _flow_tests(file: str):
    """A module of tests/flows (tests/ is no package): its fixtures and helpers are reused, not copied."""
    spec = importlib.util.spec_from_file_location(f"_flows_{Path(file).stem}", ROOT / "tests" / "flows" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_run = _flow_tests("test_cli_end_to_end.py")._run      # the real `cake` with a home of its own, CAKE_GPU=off


@pytest.fixture(scope="module")
def rmsnorm():
    """The example, found through its problem path in a catalogue of this module's own (the built-ins' tests
    elsewhere never see it)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("_catalogue", None), ("_paths", []), ("_by_ref", {}), ("_by_name", {})):
            mp.setattr(registry, name, value)
        mp.delenv(registry.PATH_ENV, raising=False)
        registry.use_problem_paths([EXAMPLES])
        assert not registry.catalogue().broken, [b.line() for b in registry.catalogue().broken]
        yield get_problem("rmsnorm")


def _small(p, role: str | None = None):
    s = p.shape_set("rmsnorm_small")
    return [shape for shape, r in zip(s.shapes, s.roles) if role is None or r == role]


def _planted(text: str, old: str, new: str, count: int = -1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


def test_the_example_loads_from_its_folder(rmsnorm):
    p = rmsnorm
    assert p.source == f"path {FOLDER}" and p.ref == f"path:{FOLDER}" and p.root == FOLDER
    assert [t.dtype for t in p.tensors] == ["bf16", "bf16", "f32"] and p.perturbed == "x"
    small, llm = p.shape_set("rmsnorm_small"), p.shape_set("rmsnorm_llm")
    assert max(max(s.values()) for s in small.shapes) <= p.cpu_limit
    assert any(s["N"] % 64 for s in small.shapes) and "held_out" in small.roles and "held_out" in llm.roles
    assert {s["N"] for s in llm.shapes} >= {2048, 4096, 8192} and {s["M"] for s in llm.shapes} >= {1, 8192}


def test_the_inputs_are_realistic_and_the_row_oracle_agrees_with_the_full_one(rmsnorm):
    p = rmsnorm
    shape = {"M": 40, "N": 96}
    x = p.make_inputs(shape, np.random.default_rng(3))
    assert np.count_nonzero(x["x"]) > 0.9 * x["x"].size
    rms = np.sqrt((x["x"].astype(np.float64) ** 2).mean(axis=1))
    assert rms.max() / rms.min() > 8, "rows of one scale cannot tell a kernel that skips the normalisation"
    assert abs(float(x["w"].mean()) - 1.0) < 0.1 and float(x["w"].std()) > 0.02
    full = p.oracle(x)["y"]
    rows = np.array([0, 7, 39])
    np.testing.assert_array_equal(p.oracle_rows(x, rows)["y"], full[rows])
    np.testing.assert_array_equal(p.take_rows({"y": full}, rows)["y"], full[rows])
    assert list(p.rows.rows_of_perturbed(x, np.array([5, 96 * 7 + 95, 96 * 7]))) == [0, 7]
    assert p.rows.count(shape) == 40 and p.flops(shape) > 0 and p.bytes(shape) == 2 * 40 * 96 + 2 * 96 + 4 * 40 * 96


def test_the_seed_passes_the_gate_on_the_small_set(rmsnorm):
    assert check_text(SEED.read_text(), str(SEED)) == []
    program = parse_program(SEED.read_text(), str(SEED))
    result = check_stage(program, rmsnorm, _small(rmsnorm), seed=7)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert {v.kind for v in result.value} == {"search", "strict"}     # and its strict shapes too
    assert all(v.max_error < 1e-5 for v in result.value)


@pytest.mark.parametrize("case", ["no_w", "no_eps", "sum_skips_tail", "skips_tail"])
def test_the_gate_rejects_a_planted_wrong_kernel_for_the_right_reason(rmsnorm, case):
    seed = SEED.read_text()
    text = {
        "no_w": _planted(seed, '        ewise(y_r, y_r, w_s, fn="mul")\n', ""),
        "no_eps": _planted(seed, '    ewise(inv, inv, eps, fn="add")\n', ""),
        # the sum of squares stops at the last whole tile; the output is still written everywhere
        "sum_skips_tail": _planted(seed, "range(cdiv(N, BN))", "range(N // BN)", 1),
        "skips_tail": _planted(seed, "range(cdiv(N, BN))", "range(N // BN)"),
    }[case]
    assert check_text(text, f"{case}.cake") == [], "a planted bug the verifier cannot see: only the gate can"
    program = parse_program(text, f"{case}.cake")
    shapes = _small(rmsnorm)
    result = check_stage(program, rmsnorm, shapes, seed=7, strict=False)
    assert result.outcome is Outcome.WRONG
    got = {v.shape: v for v in result.value}
    if case in ("sum_skips_tail", "skips_tail"):
        # right where N is a whole number of tiles, wrong on every shape with a tail tile
        for s in shapes:
            v = got[",".join(f"{k}={s[k]}" for k in ("M", "N"))]
            assert v.correct == (s["N"] % 64 == 0), (v.shape, v.message)
    wrong = [v for v in result.value if not v.correct]
    if case == "skips_tail":
        assert all("non-finite" in v.message and "unwritten" in v.message for v in wrong)
        return
    assert all(v.message.startswith("y: max rel error") for v in wrong), [v.message for v in wrong]
    worst = max(v.max_error for v in wrong)
    low = {"no_w": 5e-2, "no_eps": 3e-4, "sum_skips_tail": 1e-2}[case]
    assert worst >= low and worst > 3 * rmsnorm.rtol, (case, worst)


def test_the_seed_lowers_and_compiles_for_sm_90a(rmsnorm, tmp_path):
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel, lower
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    lr = lower(parse_program(SEED.read_text(), str(SEED)), SEED.name)
    assert lr.ok, [d.format(SEED.name) for d in lr.diagnostics]
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.spill_bytes == 0
    assert "warning" not in cr.artifacts.get("nvcc.log", "").lower()


def test_cake_problems_and_cake_run_take_the_problem_path(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env["CAKE_HOME"] = str(tmp_path / "home")
    cake = [sys.executable, "-m", "cake_cli.main", "--problem-path", str(EXAMPLES)]
    r = subprocess.run([*cake, "problems"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "rmsnorm" in r.stdout and "broken" not in r.stderr, r.stdout + r.stderr
    r = subprocess.run([*cake, "run", str(SEED), "--cpu", "--problem", "rmsnorm", "--shape", "M=7,N=100",
                        "--shape", "M=64,N=128"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.count("yes") == 2, r.stdout + r.stderr
    # the path may also follow the command, as with `cake evolve`
    r = subprocess.run([sys.executable, "-m", "cake_cli.main", "run", str(SEED), "--problem", "rmsnorm",
                        "--problem-path", str(EXAMPLES), "--shape", "M=5,N=70"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.count("yes") == 1, r.stdout + r.stderr


@pytest.mark.services
def test_cake_evolve_runs_the_example_end_to_end_on_the_cpu(tmp_path, services, share_compile_cache):
    import ray
    share_compile_cache(tmp_path)
    p = _run(["evolve", "rmsnorm", "--problem-path", str(EXAMPLES), "--shapes", "rmsnorm_small",
              "--generations", "2", "--population", "4"], tmp_path,
             {"CAKE_PREFECT_API_URL": services["api_url"], "CAKE_RAY_ADDRESS": ray.get_runtime_context().gcs_address},
             timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    wh = Warehouse(tmp_path / "warehouse")
    (run,) = wh.query("select run_id, problem, status from runs_latest").to_pylist()
    assert run["problem"] == "rmsnorm" and run["status"] == "completed", run
    rows = wh.query("select generation, tactic, outcome, problem from attempts").to_pylist()
    assert len(rows) == 8 and {r["problem"] for r in rows} == {"rmsnorm"}
    assert {r["generation"] for r in rows} == {0, 1}
    assert any(r["tactic"] == "seed" and r["outcome"] == "checked" for r in rows), rows
