"""`cake model`: import bench files, evaluate on held-out runs, fit, show; bad input is one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cake_core.ir.text import parse_program
from cli_run import one_error_line, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from bench_fixture import write_bench  # noqa: E402



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
    from cake_core.model.artifact import save_model
    path = save_model(AnalyticModel("H200"), tmp_path / "a.json")
    r = run("model", "show", str(path))
    assert r.exit_code == 0 and "kind: analytic" in r.output and "gpu: H200" in r.output


def _an_evolution_run(home: Path) -> None:
    """One cold run's two measured kernels (the naive seed and a retiled one) on two shapes, with ptxas reports."""
    from datetime import datetime

    from cake_core.problems import get_problem
    from warehouse import Warehouse
    seed = get_problem("gemm_bf16").seed_text()
    retiled = parse_program(seed).with_consts(BK=2 * parse_program(seed).const_env["BK"]).text()
    wh = Warehouse(home / "warehouse")
    t = datetime(2026, 12, 2, 10)
    wh.append("runs", [{"run_id": "evo", "problem": "gemm_bf16", "shape_set": "gemm_small", "harness_version": 0,
                        "agent": "tactic", "seed": 0, "generations": 2, "population": 1, "host": "h",
                        "gpu_model": "NVIDIA H200", "started_at": t, "status": "completed", "finished_at": t}])
    for g, (text, ms) in enumerate([(seed, 2.0), (retiled, 1.0), ("not IR", 0.5)]):
        wh.append("attempts", [{"attempt_id": f"a{g}", "run_id": "evo", "generation": g, "slot": 0,
                                "problem": "gemm_bf16", "ir_hash": f"h{g}", "ir_text": text, "agent": "tactic",
                                "harness_version": 0, "stage": "time", "outcome": "measured"}])
        wh.append("compiles", [{"attempt_id": f"a{g}", "source_hash": f"s{g}", "arch": "sm_90a", "seconds": 1.0,
                                "registers": 64 + g, "spill_bytes": 0, "smem_bytes": 1024, "barriers": 1,
                                "cached": False, "ok": True, "log": ""}])
        wh.append("measurements", [{"attempt_id": f"a{g}", "run_id": "evo", "shape": s, "gpu_model": "NVIDIA H200",
                                    "timer": "cuda_event", "l2": "cold-clean", "median_ms": ms * k, "p10_ms": ms * k,
                                    "p90_ms": ms * k, "runs": 20, "correct": True, "kind": "search",
                                    "measured_at": t} for s, k in (("M=64,N=64,K=64", 1), ("M=128,N=128,K=128", 4))])


def test_exported_samples_land_in_another_home_as_the_runs_they_came_from(tmp_path, monkeypatch):
    _an_evolution_run(tmp_path / "home")
    out = tmp_path / "samples" / "evo.parquet"
    r = run("model", "export-samples", "--out", str(out))
    assert r.exit_code == 0 and "6 samples of 1 runs, 3 kernels" in r.output, r.output
    r = run("model", "export-samples", "--out", str(out), "--run", "nope")
    assert r.exit_code == 2 and "no measured samples of run nope" in one_error_line(r)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "other"))
    r = run("model", "import-bench", str(out))
    assert r.exit_code == 0 and "evo.parquet: 1 runs, 2 attempts, 4 measurements; 1 programs left out" in r.output
    assert "a2: does not parse today" in r.output
    got = run("sql", "select a.ir_text, m.shape, m.median_ms, c.registers, m.run_id from measurements m join attempts a "
                     "using (attempt_id) join compiles c using (attempt_id) order by 3", "--format", "json")
    rows = json.loads(got.output)
    assert [(x["median_ms"], x["registers"], x["run_id"]) for x in rows] == \
        [(1.0, 65, "evo"), (2.0, 64, "evo"), (4.0, 65, "evo"), (8.0, 64, "evo")]
    assert rows[0]["ir_text"] == parse_program(rows[0]["ir_text"]).text() and rows[0]["ir_text"] != rows[1]["ir_text"]
    again = run("model", "import-bench", str(out))
    assert again.exit_code == 0 and "already imported" in again.output
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    r = run("model", "import-bench", str(bad))
    assert r.exit_code == 1 and "not a Parquet sample file" in one_error_line(r)
