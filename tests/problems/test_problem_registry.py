"""Finding problems: built-in folders, entry points of installed packages, problem paths; broken plugins refused
in one line without taking the built-ins down; a plugin problem reaching a Ray worker in another process."""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cake_core.problems import ENTRY_POINT_GROUP, UnknownProblem, get_problem, list_problems
from cake_core.problems import registry

ROOT = Path(__file__).resolve().parents[2]
# every built-in problem package: a folder of cake_core/problems with kernels/ beside its spec
BUILT_IN = {d.name for d in (ROOT / "cake_core" / "problems").iterdir() if (d / "kernels").is_dir()}
GEMM_SEED = ROOT / "cake_core" / "problems" / "gemm_bf16" / "kernels" / "gemm_bf16.cake"   # read without discovery

# a plugin problem: C = A @ B under another name, with a seed of its own and one shape set
SPEC = '''
from pathlib import Path

from cake_core.problems import Problem, data, output
from cake_core.problems.base import as_sampler, bf16_round
from cake_core.problems.common import matmul


def _inputs(s, rng):
    r = as_sampler(rng)
    return {"a": bf16_round(r.normal((s["M"], s["K"]))), "b": bf16_round(r.normal((s["K"], s["N"])))}


PROBLEM = Problem(
    name="{name}", description="C = A @ B, a plugin", dims=("M", "N", "K"),
    tensors=(data("a", "bf16"), data("b", "bf16"), output("c", "f32")),
    make_inputs=_inputs, oracle=matmul.oracle, rtol=2e-3, flops=matmul.flops, bytes=matmul.nbytes,
    seed_file="seed.cake", shape_sets=("tiny",), rows=matmul.ROWS,
)
'''


def _problem_folder(where: Path, name: str, spec: str | None = None) -> Path:
    folder = where / name
    (folder / "kernels").mkdir(parents=True)
    (folder / "shapes").mkdir()
    (folder / "__init__.py").write_text(spec if spec is not None else SPEC.replace("{name}", name))
    (folder / "kernels" / "seed.cake").write_text(GEMM_SEED.read_text())
    (folder / "shapes" / "tiny.csv").write_text("M,N,K,role\n32,24,40,headline\n33,17,9,tail\n")
    return folder


@pytest.fixture
def fresh(monkeypatch):
    """A catalogue discovered anew for the test, and forgotten after it."""
    monkeypatch.setattr(registry, "_catalogue", None)
    monkeypatch.setattr(registry, "_paths", [])
    monkeypatch.setattr(registry, "_by_ref", {})
    monkeypatch.setattr(registry, "_by_name", {})
    monkeypatch.delenv(registry.PATH_ENV, raising=False)
    yield registry


def _installed(site: Path, dist: str, module: str, name: str) -> None:
    """An installed distribution ``dist`` in ``site`` whose ``cake.problems`` entry point names ``module``."""
    _problem_folder(site, module, SPEC.replace("{name}", name))
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {module}:PROBLEM\n")


def test_the_built_ins_are_found_in_their_own_folders(fresh):
    probs = {p.name: p for p in list_problems()}
    assert set(probs) >= BUILT_IN and not fresh.catalogue().broken
    for name in BUILT_IN:
        p = probs[name]
        assert p.source == "built-in" and p.root == ROOT / "cake_core" / "problems" / name
        assert (p.kernels_dir / p.seed_file).is_file() and all((p.shapes_dir / f"{s}.csv").is_file()
                                                               for s in p.shape_sets)


def test_a_problem_folder_on_the_path_is_found_and_named_by_its_reference(fresh, tmp_path):
    folder = _problem_folder(tmp_path, "mm_path")
    fresh.use_problem_paths([tmp_path])
    p = get_problem("mm_path")
    assert p.source == f"path {folder}" and p.ref == f"path:{folder}"
    assert p.shape_set("tiny").shapes[1] == {"M": 33, "N": 17, "K": 9}
    assert get_problem(p.ref) is p
    assert set(q.name for q in list_problems()) >= BUILT_IN | {"mm_path"}


def test_the_path_may_also_come_from_the_environment(fresh, tmp_path, monkeypatch):
    _problem_folder(tmp_path, "mm_env")
    monkeypatch.setenv(fresh.PATH_ENV, str(tmp_path))
    assert get_problem("mm_env").name == "mm_env"


def test_an_entry_point_of_an_installed_package_registers_a_problem(fresh, tmp_path, monkeypatch):
    _installed(tmp_path, "cake_plugin_mm", "plugmm", "mm_entry")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = get_problem("mm_entry")
    assert p.source == "entry point cake_plugin_mm" and p.ref == "plugmm:PROBLEM"
    assert p.root == tmp_path / "plugmm"


@pytest.mark.parametrize("case, spec, words", [
    ("syntax", "PROBLEM = (\n", ["__init__.py:1", "syntax error"]),
    ("no_oracle", SPEC.replace("{name}", "no_oracle").replace("oracle=matmul.oracle, ", ""),
     ["__init__.py", "oracle"]),
    ("no_problem", "X = 1\n", ["defines no PROBLEM"]),
    ("wrong_dtype", SPEC.replace("{name}", "wrong_dtype").replace('output("c", "f32")', 'output("c", "bf16")'),
     ["seed.cake", "parameter `c` is f32", "declares it bf16"]),
])
def test_a_broken_plugin_is_one_line_and_the_built_ins_still_load(fresh, tmp_path, case, spec, words):
    _problem_folder(tmp_path, case, spec)
    fresh.use_problem_paths([tmp_path])
    cat = fresh.catalogue()
    assert set(cat.problems) == BUILT_IN
    (b,) = cat.broken
    line = b.line()
    assert "\n" not in line and all(w in line for w in words), line
    assert f"path {tmp_path}" in line
    with pytest.raises(UnknownProblem, match="broken"):
        get_problem(case)
    assert get_problem("gemm_bf16").seed_text()


def test_a_seed_that_does_not_parse_is_refused_at_its_line(fresh, tmp_path):
    folder = _problem_folder(tmp_path, "bad_seed")
    (folder / "kernels" / "seed.cake").write_text("@kernel(target='sm_90a', grid=(1,), threads=32)\ndef k(:\n")
    fresh.use_problem_paths([tmp_path])
    (b,) = fresh.catalogue().broken
    assert "seed.cake:2" in b.line() and "does not parse" in b.line()
    assert set(fresh.catalogue().problems) == BUILT_IN


def test_a_plugin_may_not_take_a_built_in_name(fresh, tmp_path):
    _problem_folder(tmp_path, "gemm_bf16")
    fresh.use_problem_paths([tmp_path])
    (b,) = fresh.catalogue().broken
    assert "taken by the built-in problem" in b.line()
    assert get_problem("gemm_bf16").source == "built-in"


def test_a_problem_is_pickled_as_its_reference_and_its_changes():
    p = get_problem("knn_topk")
    blob = pickle.dumps(p)
    assert b"make_inputs" not in blob and len(blob) < 400        # the reference, not the functions
    assert pickle.loads(blob) is p
    q = pickle.loads(pickle.dumps(replace(p, rtol=0.25)))
    assert q.rtol == 0.25 and q.oracle is p.oracle


def test_cake_problems_lists_where_each_came_from_and_the_broken_ones(tmp_path):
    _problem_folder(tmp_path, "mm_cli")
    _problem_folder(tmp_path, "mm_broken", "PROBLEM = (\n")
    env = {**os.environ, "CAKE_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "cake_cli.main", "problems", "--problem-path", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "mm_cli" in out and "built-in" in out and "path" in out
    broken = [ln for ln in r.stderr.splitlines() if ln.startswith("broken problem:")]
    assert len(broken) == 1 and "mm_broken" in broken[0] and "syntax error" in broken[0]


@pytest.fixture(scope="module")
def ray_with_site(tmp_path_factory):
    """A local Ray whose workers see a site folder with an installed plugin distribution, and a problem folder."""
    ray = pytest.importorskip("ray")
    site = tmp_path_factory.mktemp("site")
    _installed(site, "cake_plugin_ray", "plugray", "mm_ray")
    folder = _problem_folder(tmp_path_factory.mktemp("probs"), "mm_folder")
    if ray.is_initialized():
        pytest.skip("a Ray of another test is running in this process")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}})
    sys.path.insert(0, str(site))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers cannot import this test file
    try:
        yield ray, folder
    finally:
        sys.path.remove(str(site))
        ray.shutdown()


def _in_worker(problem, shape):
    """What a worker computes with the problem it was sent: its pid, name, reference and oracle on fresh inputs."""
    x = problem.make_inputs(shape, np.random.default_rng(5))
    return os.getpid(), problem.name, problem.ref, problem.oracle(x)["c"]


def test_a_problem_from_an_entry_point_reaches_a_ray_worker_in_another_process(fresh, ray_with_site):
    ray, folder = ray_with_site
    shape = {"M": 16, "N": 8, "K": 24}
    for p in (get_problem("mm_ray"), get_problem(f"path:{folder}")):
        assert p.name in ("mm_ray", "mm_folder")
        pid, name, ref, c = ray.get(ray.remote(_in_worker).remote(p, shape), timeout=120)
        assert pid != os.getpid() and (name, ref) == (p.name, p.ref)
        np.testing.assert_allclose(c, p.oracle(p.make_inputs(shape, np.random.default_rng(5)))["c"])


def test_the_built_ins_are_named_nowhere_outside_their_own_folders():
    """grep of each built-in name in the orchestration packages finds only its own package."""
    for name in BUILT_IN:
        hits = subprocess.run(["grep", "-rl", "--include=*", name, "cake_core", "tasks", "flows", "cake_cli",
                               "warehouse"], capture_output=True, text=True, cwd=ROOT).stdout.split()
        hits = [h for h in hits if "__pycache__" not in h]
        outside = [h for h in hits if not h.startswith(f"cake_core/problems/{name}/")]
        assert not outside, f"{name} is named outside its package: {outside}"


def test_copying_a_built_in_folder_makes_a_plugin(fresh, tmp_path):
    """A problem folder is self-contained: a copy of a built-in's files under another name loads as a plugin."""
    src = get_problem("tinygemm").root
    dst = tmp_path / "tiny_copy"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    text = (dst / "__init__.py").read_text().replace('name="tinygemm"', 'name="tiny_copy"')
    (dst / "__init__.py").write_text(text.replace("root=Path(__file__).resolve().parent,", ""))
    fresh.use_problem_paths([tmp_path])
    p = get_problem("tiny_copy")
    assert p.root == dst and p.seed_text() == get_problem("tinygemm").seed_text()
    assert textwrap.dedent(p.description)
