"""`cake evolve`: the flow run and reported, the checks made before any service starts, Ctrl-C, the GPUs asked
for and shape files by path, with stand-ins for the flow, the warehouse and the services (tests/cli/stand_ins.py)."""
from __future__ import annotations

import contextlib
import time
import types

import pyarrow as pa
import pytest

import cake_cli.evolve_run as evolve_run
import cake_cli.main as main
from cake_cli.services import PrefectServer, ServiceError
from cake_core.errors import CakeError
from cli_run import one_error_line, run
from stand_ins import fake_module, no_services, warehouse  # noqa: F401 - fixtures


# ---------------------------------------------------------------- evolve


@pytest.fixture
def corpus(monkeypatch):
    problem = types.SimpleNamespace(name="gemm_bf16", description="", shape_sets=("square",), cpu_limit=160,
                                    source="built-in")

    def load_shape_set(prob, name):
        loaded.append((prob.name, name))
        return types.SimpleNamespace(name=name, shapes=({"M": 64, "N": 64, "K": 64},), roles=("headline",))

    loaded = []
    monkeypatch.setattr("cake_core.problems.get_problem", lambda name: problem)
    monkeypatch.setattr("cake_core.problems.load_shape_set", load_shape_set)
    return loaded


def test_evolve_runs_the_flow_and_reports(monkeypatch, tmp_path, warehouse, no_services, corpus):
    calls = []

    def evolve_flow(**kwargs):
        calls.append(kwargs)
        warehouse.tables["from attempts"] = pa.table(
            {"generation": [0, 0, 1], "outcome": ["checked", "verify_failed", "checked"],
             "n": [5, 3, 8], "ms": [0.5, None, 0.25]})
        warehouse.tables["from measurements"] = pa.table({"m": pa.array([None], pa.float64())})
        # the run's best is the warehouse's (view run_best over kernel_scores); a CPU run's is predicted
        warehouse.tables["from run_best"] = pa.table({"basis": ["predicted"], "score_ms": [0.25]})
        warehouse.tables["from baseline_scores"] = pa.table(
            {"name": pa.array([], pa.string()), "source": pa.array([], pa.string()),
             "basis": pa.array([], pa.string()), "score_ms": pa.array([], pa.float64()),
             "correct": pa.array([], pa.bool_())})
        return None

    fake_module(monkeypatch, "flows.evolve", evolve_flow=evolve_flow)
    result = run("evolve", "gemm_bf16", "--generations", "2", "--population", "4", "--seed", "7")
    assert result.exit_code == 0, result.output
    assert corpus == [("gemm_bf16", "square")]
    (kw,) = calls
    home = tmp_path / "home"
    assert kw["problem"] == "gemm_bf16" and kw["shape_set"] == "square"
    assert (kw["generations"], kw["population"], kw["seed"]) == (2, 4, 7)
    assert kw["warehouse_root"] == str(home / "warehouse") and kw["cache_dir"] == str(home / "cache")
    assert kw["gpu_models"] == [] and kw["run_id"].startswith("gemm_bf16-")
    assert no_services == ["prefect", "ray:0"]
    out = result.stdout
    assert f"warehouse: {home / 'warehouse'}" in out and "http://127.0.0.1:4200" in out
    assert "nothing timed" in out and "cake sql" in out and kw["run_id"] in out
    assert ("select generation, outcome, count(*) as n, min(predicted_ms) as ms from attempts "
            "where run_id = ? group by all order by all", [kw["run_id"]]) in warehouse.queries
    assert "predicted 0.25 ms, from 0.5 ms in generation 0" in out


def test_evolve_flow_failure_is_one_line(monkeypatch, warehouse, no_services, corpus):
    def evolve_flow(**kwargs):
        raise CakeError("harness version 9 does not exist; run `cake harness versions`")

    fake_module(monkeypatch, "flows.evolve", evolve_flow=evolve_flow)
    result = run("evolve", "gemm_bf16", "--shapes", "llm_decode")
    assert result.exit_code == 1
    assert one_error_line(result) == ("error: harness version 9 does not exist; "
                                      "run `cake harness versions`")
    assert corpus == [("gemm_bf16", "llm_decode")]


def test_evolve_checks_gpu_policy_before_services(monkeypatch, no_services, corpus):
    def require(settings):
        raise ServiceError("no NVIDIA GPU found; run with CAKE_GPU=auto or off to check on the CPU")

    monkeypatch.setattr(main, "gpu_policy", require)
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 1 and "no NVIDIA GPU found" in one_error_line(result)
    assert no_services == []


def test_evolve_llm_agent_needs_a_model(no_services, corpus):
    result = run("evolve", "gemm_bf16", "--agent", "llm")
    assert result.exit_code == 2 and "CAKE_LLM_MODEL" in one_error_line(result)
    result = run("evolve", "gemm_bf16", "--agent", "genius")
    assert result.exit_code == 2 and "tactic or llm" in one_error_line(result)


def test_evolve_ctrl_c_stops_and_says_what_was_recorded(monkeypatch, warehouse, no_services, corpus):
    from tasks.run_control import sealed, stop_requested

    cancelled, seen = [], {}

    def evolve_flow(**kwargs):
        warehouse.tables["from attempts"] = pa.table(
            {"generation": [0], "outcome": ["measured"], "n": [4], "ms": [0.3]})
        warehouse.tables["from measurements"] = pa.table({"m": [0.25]})
        deadline = time.monotonic() + 30
        while not stop_requested(kwargs["run_id"]) and time.monotonic() < deadline:
            time.sleep(0.01)        # a stage boundary: the real flow checks here too
        seen["stopped"] = stop_requested(kwargs["run_id"])

    fake_module(monkeypatch, "flows.evolve", evolve_flow=evolve_flow)
    monkeypatch.setattr(main, "gpu_policy", lambda settings: ["NVIDIA H200"])
    monkeypatch.setattr(main, "preflight", lambda *a: None)
    monkeypatch.setattr(evolve_run, "_cancel_flow_run", cancelled.append)
    views = []
    real_view = evolve_run.live_view

    def view(*args):
        views.append(args)
        if len(views) == 3:   # a person presses Ctrl-C while the flow runs
            raise KeyboardInterrupt
        return real_view(*args)

    monkeypatch.setattr(evolve_run, "live_view", view)
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 130, result.output
    assert result.stderr == ""
    assert seen == {"stopped": True}   # the flow saw the stop (seal stops it too)
    run_id = cancelled[0][len("cake-run:"):]
    assert len(cancelled) == 1 and run_id.startswith("gemm_bf16-") and sealed(run_id)
    out = result.stdout
    assert out.index("stopping run") < out.index("stopped. recorded 4 attempts") and "(4 measured)" in out
    assert "cake sql" in out
    assert no_services == ["prefect", "ray:1", "resources:[('gpu_model:H200', 1.0)]"]   # the local Ray's model


def test_the_gpu_model_asked_for_and_the_local_gpus(monkeypatch):
    from cake_cli.config import load_settings

    monkeypatch.setattr(main, "gpu_policy", lambda settings: [] if settings.gpu == "off" else ["NVIDIA H200"] * 2)
    assert main._gpus_asked(load_settings()) == (["NVIDIA H200"] * 2, ["NVIDIA H200"] * 2)
    monkeypatch.setenv("CAKE_GPU_MODEL", "H100")
    assert main._gpus_asked(load_settings()) == (["NVIDIA H200"] * 2, ["H100"])   # the open-run check refuses it
    monkeypatch.setenv("CAKE_RAY_ADDRESS", "ray://head:10001")
    assert main._gpus_asked(load_settings()) == ([], ["H100"])         # the cluster's nodes declare their GPUs
    monkeypatch.setenv("CAKE_GPU", "off")
    assert main._gpus_asked(load_settings()) == ([], [])


# ---------------------------------------------------------------- checks before any service


def test_home_that_cannot_be_written_fails_before_any_service(monkeypatch, tmp_path, no_services, corpus):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CAKE_HOME", str(blocker / "home"))
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert f"the Cake home {blocker / 'home'} is not writable" in line and "set CAKE_HOME" in line
    assert no_services == []


def test_unreachable_llm_endpoint_fails_before_any_service(monkeypatch, free_port, no_services, corpus):
    monkeypatch.setenv("CAKE_LLM_MODEL", "m")
    monkeypatch.setenv("CAKE_LLM_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    result = run("evolve", "gemm_bf16", "--agent", "llm")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "the LLM endpoint http://127.0.0.1:" in line and "does not answer" in line
    assert "sk-test" not in result.output
    assert no_services == []


def test_unreachable_ray_address_fails_before_any_service(monkeypatch, free_port, no_services, corpus):
    monkeypatch.setenv("CAKE_RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 1 and "unset CAKE_RAY_ADDRESS" in one_error_line(result)
    assert no_services == []


def test_gpu_run_without_nvcc_fails_before_any_service(monkeypatch, no_services, corpus):
    monkeypatch.setattr(main, "gpu_policy", lambda settings: ["NVIDIA H200"])
    monkeypatch.setattr("cake_core.lower.compile.nvcc_path", lambda: None)
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 1 and "nvcc, which is not on PATH" in one_error_line(result)
    assert no_services == []


def test_evolve_says_what_it_found_about_the_server(monkeypatch, warehouse, no_services, corpus):
    @contextlib.contextmanager
    def shared(settings):
        no_services.append("prefect")
        yield PrefectServer(api_url="http://127.0.0.1:4200/api", ui_url="http://127.0.0.1:4200", started=False,
                            note="reusing this home's Prefect server (pid 7) left running by an earlier run")

    monkeypatch.setattr(evolve_run, "prefect_server", shared)
    fake_module(monkeypatch, "flows.evolve", evolve_flow=lambda **kw: None)
    result = run("evolve", "gemm_bf16")
    assert result.exit_code == 0, result.output
    assert "reusing this home's Prefect server (pid 7)" in result.stdout



def test_shapes_takes_a_path_relative_or_absolute(monkeypatch, tmp_path, no_services, warehouse):
    from cake_core.problems import get_problem, load_shape_set

    (tmp_path / "sets").mkdir()
    csv_file = tmp_path / "sets" / "mine.csv"
    csv_file.write_text("M,N,K,role\n64,64,64,headline\n33,17,9,tail\n")
    loaded = load_shape_set(get_problem("gemm_bf16"), "sets/mine.csv")          # relative to the cwd
    assert loaded.shapes == ({"M": 64, "N": 64, "K": 64}, {"M": 33, "N": 17, "K": 9})
    assert loaded.roles == ("headline", "tail")
    assert load_shape_set(get_problem("gemm_bf16"), str(csv_file)).shapes == loaded.shapes
    calls = []
    fake_module(monkeypatch, "flows.evolve", evolve_flow=lambda **kw: calls.append(kw))
    for given in ("sets/mine.csv", str(csv_file), "./sets/mine.csv"):
        result = run("evolve", "gemm_bf16", "--shapes", given)
        assert result.exit_code == 0, result.output
        assert calls[-1]["shape_set"] == str(csv_file)   # the flow gets the file, wherever it runs
    result = run("evolve", "gemm_bf16", "--shapes", "nope/missing.csv")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "no shape file nope/missing.csv" in line and str(tmp_path / "nope" / "missing.csv") in line
    result = run("evolve", "gemm_bf16", "--shapes", "gemm_nope")
    assert result.exit_code == 2 and "passed by its path" in one_error_line(result)
