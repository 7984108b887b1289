"""`cake experiment transfer`: what it hands the experiment, what it prints last, and its refusals."""
from __future__ import annotations

import contextlib

import cli_run
import pytest
from cli_run import one_error_line
from harness_runs import source_home


def run(*args: str):
    return cli_run.run("experiment", "transfer", *args)


@pytest.fixture
def no_services(monkeypatch):
    import cake_cli.services as services
    monkeypatch.setattr(services, "prefect_server", lambda settings: contextlib.nullcontext())
    monkeypatch.setattr(services, "ray_runtime", lambda settings, num_gpus=0, resources=None: contextlib.nullcontext())


@pytest.fixture
def never_runs(monkeypatch):
    import cake_cli.experiment_cli as ex

    def never(*a, **kw):
        raise AssertionError("the experiment ran")
    monkeypatch.setattr(ex, "run_transfer", never)


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """Source homes: one with three approved changes after runs of gemm_bf16 and kmeans_assign, one that also
    ran moe before them, one without an approved change, one without a warehouse."""
    root = tmp_path_factory.mktemp("homes")
    source_home(root / "learned")
    source_home(root / "saw-moe", problems=("gemm_bf16", "moe"))
    source_home(root / "unreviewed", changes=())
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("args, says", [
    (["--problems", "kda_decode,no_such_problem"], "no_such_problem"),
    (["--problems", "moe,moe"], "--problems names moe twice"),
    (["--problems", " , "], "--problems names no problem"),
    (["--problems", "moe", "--shapes", "moe=nope"], "nope"),
    (["--problems", "moe", "--shapes", "moe_small"], "--shapes 'moe_small': give PROBLEM=SET"),
    (["--problems", "moe", "--shapes", "kda_decode=kda_decode_small"], "--shapes names kda_decode, which --problems"),
    (["--seed-target", "1"], "--seed-target must be above 1"),
    (["--budget-gpu-minutes", "1"], "--budget-gpu-minutes needs a GPU"),
])
def test_bad_requests_get_one_line_before_anything_starts(monkeypatch, no_services, never_runs, homes, tmp_path, args,
                                                          says):
    monkeypatch.setenv("CAKE_GPU", "off")
    budget = [] if "--budget-gpu-minutes" in args else ["--budget-candidates", "8"]
    result = run("--cpu", "--learned-from", str(homes / "learned"), *budget, *args, "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert says in one_error_line(result)
    assert not (tmp_path / "o").exists()                    # refused before anything was written


@pytest.mark.parametrize("source, says", [
    ("missing", "no such folder"),
    ("empty", "is neither a Cake home with a warehouse"),
    ("unreviewed", "holds no approved harness change (only the built-in v0): review its runs"),
    ("saw-moe", "has runs of moe (1) from before harness v3 was approved: its review may have learned from them"),
])
def test_a_source_home_the_learned_arm_cannot_carry_from_is_one_line(monkeypatch, no_services, never_runs, homes,
                                                                      tmp_path, source, says):
    monkeypatch.setenv("CAKE_GPU", "off")
    result = run("--cpu", "--learned-from", str(homes / source), "--problems", "kda_decode,moe",
                 "--budget-candidates", "8", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert says in one_error_line(result)


def test_what_the_command_needs_before_it_reads_a_source(monkeypatch, no_services, never_runs, homes, tmp_path):
    monkeypatch.setenv("CAKE_GPU", "off")
    out = str(tmp_path / "o")
    assert "give the arms a budget" in one_error_line(run("--cpu", "--learned-from", str(homes / "learned"),
                                                          "--out", out))
    assert "no GPU here (or CAKE_GPU=off): pass --cpu" in one_error_line(
        run("--learned-from", str(homes / "learned"), "--budget-candidates", "8", "--out", out))
    assert "give --learned-from HOME" in one_error_line(run("--cpu", "--budget-candidates", "8", "--out", out))
    assert "holds no harness version 9 (it has 0, 1, 2, 3)" in one_error_line(
        run("--cpu", "--learned-from", str(homes / "learned"), "--learned-version", "9", "--budget-candidates", "8",
            "--out", out))


def test_the_cpu_mode_hands_over_its_plan_and_prints_the_goals_last(monkeypatch, no_services, homes, tmp_path):
    import cake_cli.experiment_cli as ex
    from tasks.transfer import summary
    got = {}
    rows = [{"arm": a, "problem": p, "seed": s, "attempts": 8, "converged": a == "learned", "gpu_min": 0.0,
             "gpu_min_to_converge": 0.0, "candidates_to_converge": 4, "doomed_gpu_s": 0.0,
             "doomed_candidates": 2 if a == "frozen" else 1,
             "winner_used": ["calibration v3"] if a == "learned" else []}
            for p in ("kda_decode", "moe") for s in (0, 1) for a in ("frozen", "learned")]

    def experiment(plan, gpu_models=None, say=None, **kw):
        got.update(plan=plan, gpu_models=gpu_models)
        return {"rows": rows, "summary": summary(rows, timed=False), "converged_means": "a kernel at least 0.9x ..."}
    monkeypatch.setattr(ex, "run_transfer", experiment)
    monkeypatch.setenv("CAKE_GPU", "off")
    result = run("--cpu", "--learned-from", str(homes / "learned"), "--problems", "kda_decode,moe", "--seeds", "2",
                 "--budget-candidates", "16", "--block", "1", "--shapes", "moe=moe_decode",
                 "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    plan = got["plan"]
    assert plan["problems"] == ["kda_decode", "moe"] and plan["seeds"] == [0, 1] and got["gpu_models"] == []
    assert plan["shape_sets"] == {"kda_decode": "kda_decode_small", "moe": "moe_decode"}
    assert (plan["budget_candidates"], plan["block"], plan["mode"], plan["learned_version"]) == (16, 1, "cpu", 3)
    assert plan["out_dir"] == str(tmp_path / "o") and len(plan["runs"]) == 8
    lines = result.stdout.strip().splitlines()
    assert "learned arm: harness v3 of" in result.stdout
    assert lines[-5].startswith("converged: learned 4/4 runs, frozen 0/4; goal: at least as many: met")
    assert lines[-1].startswith("doomed candidates: learned 4, frozen 8, 50% fewer")
    assert "| learned | moe | 2 | 2 |" in result.stdout and "calibration v3 in 2/2" in result.stdout


def test_by_default_the_experiment_takes_every_problem_the_source_never_ran(monkeypatch, no_services, homes,
                                                                           tmp_path):
    import cake_cli.experiment_cli as ex
    from cake_core.problems import list_problems
    got = {}

    def experiment(plan, **kw):
        got.update(plan)
        raise KeyboardInterrupt
    monkeypatch.setattr(ex, "run_transfer", experiment)
    monkeypatch.setenv("CAKE_GPU", "off")
    result = run("--cpu", "--learned-from", str(homes / "learned"), "--budget-candidates", "8",
                 "--out", str(tmp_path / "o"))
    assert result.exit_code == 130
    never_ran = [p.name for p in list_problems() if p.name not in ("gemm_bf16", "kmeans_assign")]
    assert got["problems"] == never_ran and got["seeds"] == [0, 1, 2]
    assert {"kda_decode", "kda_prefill", "kda_varlen", "moe"} <= set(never_ran)
