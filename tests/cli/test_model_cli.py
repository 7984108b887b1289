"""`cake model`: import bench files, evaluate on held-out runs, fit, show; bad input is one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from cake_cli.main import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from bench_fixture import write_bench  # noqa: E402

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def one_error_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_import_then_eval_on_held_out_runs(tmp_path):
    files = [str(write_bench(tmp_path / f"b{d}.json", day=d, scale=1 + 0.1 * d)) for d in (1, 2, 3)]
    r = run("model", "import-bench", "--no-check", *files)
    assert r.exit_code == 0, r.output
    assert "b1.json: 1 runs, 3 attempts, 9 measurements; 1 programs left out" in r.output
    again = run("model", "import-bench", "--no-check", files[0])
    assert again.exit_code == 0 and "already imported" in again.output
    r = run("model", "eval", "--out", str(tmp_path / "eval.json"))
    assert r.exit_code == 0, r.output
    assert "leave-one-run-out cross validation over 3 runs" in r.output
    assert "analytic" in r.output and "learned vs analytic" in r.output
    res = json.loads((tmp_path / "eval.json").read_text())
    overall = res["results"]["analytic"]["overall"]
    assert overall["samples"] == 27 and overall["cells"] == 9 and overall["best_survives"] is not None
    assert any("not fitted" in n for n in res["notes"])                  # 18 samples: too few per fold
    r = run("model", "fit", "--out", str(tmp_path / "m.json"))
    assert r.exit_code == 0, r.output
    assert "fitted on 27 samples of 3 runs" in r.output and "runs will keep the analytic model" in r.output
    r = run("sql", "select kind, beats_analytic, split from model_versions", "--format", "json")
    assert json.loads(r.output) == [{"kind": "learned", "beats_analytic": False, "split": "run"}]
    r = run("model", "show", str(tmp_path / "m.json"))
    assert "kind: learned" in r.output and "beats_analytic: False" in r.output and "held-out:" in r.output
    r = run("model", "eval", "--model", str(tmp_path / "m.json"))
    assert r.exit_code == 0 and "file:" not in r.output and "fitted on every run here" in r.output


def test_fit_with_too_little_data_and_bad_model_files(tmp_path):
    r = run("model", "eval")
    assert r.exit_code == 2 and "no warehouse at" in one_error_line(r)
    run("model", "import-bench", "--no-check", str(write_bench(tmp_path / "b1.json")))
    r = run("model", "fit", "--out", str(tmp_path / "m.json"))
    assert r.exit_code == 1 and "needs 12 measured samples" in one_error_line(r)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "cake-cost-model", "format_version": 1, "payload": {}, "checksum": "x"}')
    r = run("model", "show", str(bad))
    assert r.exit_code == 1 and "is corrupted: its payload does not match its checksum" in one_error_line(r)
    r = run("model", "eval", "--model", str(bad))
    assert r.exit_code == 1 and "corrupted" in one_error_line(r)
    r = run("model", "import-bench", str(tmp_path / "nope.json"))
    assert r.exit_code == 1 and "no such file" in one_error_line(r)
    r = run("model", "eval", "--split", "random")
    assert r.exit_code == 2 and "use one of run, time" in one_error_line(r)


def test_show_prints_the_header(tmp_path):
    from cake_core.model.analytic import AnalyticModel
    path = AnalyticModel("H200").save(tmp_path / "a.json")
    r = run("model", "show", str(path))
    assert r.exit_code == 0 and "kind: analytic" in r.output and "gpu: H200" in r.output
