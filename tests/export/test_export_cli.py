"""`cake export`: the package and its table from a warehouse; each refusal one line with the exit code of the
other commands (2: a selection the warehouse does not hold, 1: nothing to export)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.main import app
from cake_core.lower.compile import nvcc_path
from export_rows import PROBLEM, land

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch, share_compile_cache):
    """A Cake home in an empty folder whose warehouse holds export_rows' measurements."""
    import os
    for name in list(os.environ):
        if name.upper().startswith("CAKE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    share_compile_cache(tmp_path / "home")
    land(tmp_path / "home" / "warehouse")
    return tmp_path


def one_line(r) -> str:
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    return lines[0]


@pytest.mark.skipif(nvcc_path() is None, reason="export compiles each kernel with nvcc, absent here")
def test_export_writes_the_package_and_prints_its_routes(home):
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200", "--run", "exp-1"])
    assert r.exit_code == 0, r.output
    m = json.loads((home / "dist" / f"cake_{PROBLEM}" / "manifest.json").read_text())
    assert len(m["exact"]) == 5 and len(m["kernels"]) == 3
    assert ("5 measured shapes routed (0 held out), 3 kernels, GPU model H200; held-out rows left to the "
            "nearest-shape routing: 1 (not covered without --unmeasured)") in r.output
    assert "kmeans_assign_ws_" in r.output and "exact" in r.output
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200", "--name", "km_small",
                            "--shapes", "kmeans_assign_small"])
    assert r.exit_code == 0 and (home / "dist" / "km_small" / "__init__.py").is_file(), r.output


@pytest.mark.skipif(nvcc_path() is None, reason="export compiles each kernel with nvcc, absent here")
def test_held_out_rows_are_routed_by_their_measurements_only_with_include_held_out(home):
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200", "--unmeasured"])
    assert r.exit_code == 0, r.output
    assert "5 measured shapes routed (0 held out), 3 kernels, GPU model H200; held-out rows left to the " \
           "nearest-shape routing: 1; import" in r.output
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200", "--include-held-out"])
    assert r.exit_code == 0, r.output
    assert "6 measured shapes routed (1 held out), 3 kernels, GPU model H200; import" in r.output
    assert "nearest-shape" not in r.output
    m = json.loads((home / "dist" / f"cake_{PROBLEM}" / "manifest.json").read_text())
    assert len(m["exact"]) == 6
    r = runner.invoke(app, ["export", "--help"])
    assert "--include-held-out" in r.output and "generalisation" in r.output


def test_a_gpu_model_not_measured_and_an_ambiguous_one_are_one_line(home):
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "B200"])
    assert r.exit_code == 2 and "measured on: H100, H200" in one_line(r)
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist"])
    assert r.exit_code == 2 and "several GPU models (H100, H200)" in one_line(r)


def test_an_empty_selection_and_an_unknown_run_are_one_line(home):
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200", "--shapes",
                            "kmeans_assign_large"])
    assert r.exit_code == 2 and "was measured correct on H200" in one_line(r)
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--run", "nope"])
    assert r.exit_code == 2 and "no run 'nope'" in one_line(r) and "exp-1" in r.output
    assert not (home / "dist").exists()


def test_a_problem_without_measurements_is_one_line(home):
    r = runner.invoke(app, ["export", "gemm_bf16", "--out", "dist"])
    assert r.exit_code == 1 and "gemm_bf16 has no correct measurement" in one_line(r)
    r = runner.invoke(app, ["export", "no_such_problem", "--out", "dist"])
    assert r.exit_code == 2 and one_line(r)


def test_no_nvcc_is_one_line(home, monkeypatch):
    monkeypatch.setattr("cake_core.export.build.nvcc_path", lambda: None)
    r = runner.invoke(app, ["export", PROBLEM, "--out", "dist", "--gpu-model", "H200"])
    assert r.exit_code == 1 and "nvcc was not found" in one_line(r) and "CAKE_NVCC" in r.output
