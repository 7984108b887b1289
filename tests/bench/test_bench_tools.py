"""bench/ncu_summary.py reads Nsight Compute's raw and source CSV pages (the layout bench/gpu.sh profile
writes); bench/read_floor.py on a machine without a GPU says so and exits 2 instead of raising; bench/smem_rmw.py's
probe compiles without a GPU, and its fit is what the H200's data file holds; bench/corpus_vs_peers.py refuses
a peer name that none of its problems has, and bench/portfolio_dispatch.py an unknown problem, shape set or
package, before any GPU work."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import ncu_summary  # noqa: E402

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
RAW = "\n".join([
    "==PROF== a line ncu prints that is not CSV",
    ",".join(f'"{h}"' for h in ["ID", "Kernel Name", STALL.format("long_scoreboard"), STALL.format("barrier"),
                                 STALL.format("wait"), "dram__throughput.avg.pct_of_peak_sustained_elapsed"]),
    '"","","","","","%"',
    '"0","kmeans_update_gather","4.13","2.07","2.19","30.5"',
])
SASS = "\n".join([
    '"Kernel Name","kmeans_update_gather",',
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"',
    '"0x10","      LDC R1, c[0x0][0x28]","12","12"',
    '"0x20","      IMAD.U32 R117, R22, 0x10000, RZ","300","290"',
    '"0x30","      BAR.SYNC.DEFER_BLOCKING 0x0","88","80"',
])


def test_stall_reasons_come_largest_first(tmp_path):
    raw = tmp_path / "raw.csv"
    raw.write_text(RAW)
    (line,) = ncu_summary.stalls(raw)
    assert line.startswith("kmeans_update_gather: ")
    assert line.index("long_scoreboard 4.13") < line.index("wait 2.19") < line.index("barrier 2.07")
    assert "dram" not in line


def test_hottest_sass_lines_come_first_with_their_share(tmp_path):
    sass = tmp_path / "sass.csv"
    sass.write_text(SASS)
    head, first, second, third = ncu_summary.hot_sass(sass, top=3)
    assert "400 stall samples" in head
    assert "75.0%" in first and "IMAD.U32 R117" in first
    assert "22.0%" in second and "BAR.SYNC" in second
    assert "3.0%" in third and "LDC" in third


def test_a_missing_report_is_named_not_raised(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench/ncu_summary.py"), str(tmp_path / "raw.csv"),
                        str(tmp_path / "sass.csv")], capture_output=True, text=True)
    assert r.returncode == 2 and "raw.csv is missing" in r.stderr and "Traceback" not in r.stderr


def test_read_floor_without_a_gpu_says_so(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "bench/read_floor.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs a CUDA GPU and CuPy" in r.stderr and "Traceback" not in r.stderr


def test_the_a_rows_probe_cuts_the_box_and_the_expected_bytes():
    import tinygemm_a_rows
    from cake_core.ir.text import parse_program
    from cake_core.lower import lower
    path = ROOT / "cake_core/problems/tinygemm/kernels/tinygemm_splitk.cake"
    lk = lower(parse_program(path.read_text(), str(path)), str(path)).value
    cut = tinygemm_a_rows.cut_a_rows(lk, 8)
    assert [m.box for m in cut.tensor_maps if m.gmem == "a"] == [(8, 64)]
    assert [m.box for m in cut.tensor_maps if m.gmem == "b"] == [m.box for m in lk.tensor_maps if m.gmem == "b"]
    assert tinygemm_a_rows.EXPECT in lk.source and tinygemm_a_rows.EXPECT not in cut.source
    assert "(((8 * BK) + (BK * BN)) * 2)" in cut.source


def _arm(name, status, timed, medians, gpu_s, best):
    return {"arm": name, "status": status, "attempts": 120, "filtered": 80 if name == "filter" else 0,
            "timed_candidates": timed, "timed_medians": medians, "gpu_s": gpu_s,
            "best": {"score_ms": best, "basis": "measured"}, "recall": {"cells": 5, "missed": 0}}


def test_the_filter_pair_reports_the_cut_and_the_best_against_their_targets(tmp_path):
    import filter_pair
    met = filter_pair.compare(_arm("filter", "completed", 20, 200, 10.0, 0.0102),
                              _arm("no-filter", "completed", 80, 800, 50.0, 0.0100))
    assert (met["timed_medians_cut"], met["gpu_seconds_cut"], met["best_filter_over_no_filter"]) == (4.0, 5.0, 1.02)
    assert met["cut_met"] and met["best_met"] and met["complete"]
    missed = filter_pair.compare(_arm("filter", "completed", 30, 300, 14.0, 0.0354),
                                 _arm("no-filter", "completed", 80, 880, 55.8, 0.0280))
    assert not missed["cut_met"] and not missed["best_met"]       # 2.93x, 1.264: both short
    cut = filter_pair.compare(_arm("filter", "cancelled", 5, 50, 2.0, 0.01), _arm("no-filter", "completed", 80, 800,
                                                                                   50.0, 0.01))
    assert not cut["complete"] and not cut["cut_met"] and not cut["best_met"]   # a cut run proves nothing
    result = {"problem": "tinygemm", "shapes": "tinygemm_decode", "seed": 0, "generations": 5, "population": 24,
              "keep": 4, "host": "h", "gpu": "NVIDIA H200", "when": "now", "commands": [],
              "arms": [_arm("filter", "cancelled", 5, 50, 2.0, 0.01), {"arm": "no-filter", "error": "no run recorded"}]}
    result["compare"] = filter_pair.compare(*result["arms"])
    text = filter_pair.write_report(result, tmp_path)
    assert "| no-filter | no run recorded |" in text and "resume with the same --home" in text
    assert (tmp_path / "filter_pair.json").exists()


def test_the_filter_replay_grades_each_filter_on_what_a_no_filter_run_timed(tmp_path, capsys):
    import numpy as np
    import filter_replay
    # four candidates, two shapes: c is predicted (and measured) fastest at the large shape and third by the
    # mean (it loses the small one badly); b is the best by the geomean; d is poor everywhere
    gen = {"generation": 0, "ids": ["a", "b", "c", "d"], "shapes": ["small", "large"],
           "scores": np.array([[10.0, 1.0], [9.0, 2.0], [1.0, 5.0], [0.5, 0.5]]),
           "ms": {("a", "small"): 1.0, ("a", "large"): 8.0, ("b", "small"): 1.1, ("b", "large"): 7.0,
                  ("c", "small"): 4.0, ("c", "large"): 2.0, ("d", "small"): 5.0, ("d", "large"): 9.0}}
    got = filter_replay.replay([gen], keep=2)
    assert got["mean"] == {"gen_best_kept": 1, "generations": 1, "cell_best_kept": 1, "cells": 2,
                           "kept_over_best_geomean": round(3.5 ** 0.5, 4)}       # large: kept 7.0 over 2.0
    # shape-first keeps both shapes' winners (a, c) and drops b, the best by the geomean
    assert got["shape-first"] == {"gen_best_kept": 0, "generations": 1, "cell_best_kept": 2, "cells": 2,
                                  "kept_over_best_geomean": 1.0}
    # the filter's explore pick: a and b by the mean, then c (first at the large shape), not d
    assert got["mean+shape-winner"] == {"gen_best_kept": 1, "generations": 1, "cell_best_kept": 2, "cells": 2,
                                        "kept_over_best_geomean": 1.0}
    assert 1 < got["mean+random"]["cell_best_kept"] < 2                      # c or d, drawn
    assert filter_replay.replay([gen], keep=3)["mean"]["generations"] == 0    # all but one pass: nothing graded
    assert filter_replay.main(["--home", str(tmp_path)]) == 2
    assert "no warehouse under" in capsys.readouterr().err


def test_a_cuda_probe_is_read_as_json_and_each_way_it_fails_is_one_line(monkeypatch):
    """bench/cuda_probe.py: host-only probes exercise the whole path where nvcc is present and no GPU is."""
    from cuda_probe import ProbeFailed, run_probe

    ok = 'int main() { printf("{\\"sms\\": 132}\\n"); return 0; }'
    data = run_probe("demo", "#include <cstdio>\n" + ok, arch="sm_90a")
    assert data["sms"] == 132 and data["command"] == "python bench/demo.py" and data["measured_at"]
    assert run_probe("demo", "#include <cstdio>\n" + ok, arch="sm_90a", compile_only=True) is None
    with pytest.raises(ProbeFailed, match="demo: nvcc failed"):
        run_probe("demo", "int main( {", arch="sm_90a")
    with pytest.raises(ProbeFailed, match="printed something other than JSON"):
        run_probe("demo", '#include <cstdio>\nint main() { printf("rows: 3\\n"); return 0; }', arch="sm_90a")
    with pytest.raises(ProbeFailed, match="the probe failed"):
        run_probe("demo", '#include <cstdio>\nint main() { fprintf(stderr, "no GPU\\n"); return 1; }', arch="sm_90a")
    with pytest.raises(ProbeFailed, match="ran past 1 s"):
        run_probe("demo", "int main() { volatile int x = 0; while (true) { x = x + 1; } }", arch="sm_90a", timeout_s=1)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ProbeFailed, match="no nvcc on PATH"):
        run_probe("demo", ok, arch="sm_90a")


def test_the_smem_rmw_probe_compiles_with_the_device_header():
    """The probe includes cake_core/lower/header as the kernels do; nvcc compiles it without a GPU."""
    r = subprocess.run([sys.executable, str(ROOT / "bench/smem_rmw.py"), "--compile-only"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the probe compiles" in r.stdout


def test_the_smem_rmw_fit_recovers_the_rate_curve_and_refuses_rows_it_cannot_fit():
    import smem_rmw

    def row(lowering, threads, per_sm, rate):
        return {"lowering": lowering, "threads": threads, "rows": 384, "ctas_per_sm": per_sm, "ctas_per_sm_fit": per_sm,
                "cycles_per_call": 1.0, "elems_per_clk_per_sm": rate}

    curve = lambda n: 4.0 * n / (n + 8.0)      # noqa: E731 - per_clk 4, half_warps 8
    rows = [row("owned", t, k, curve(t / 32 * k)) for t in (128, 256, 512, 1024) for k in (1, 2)]
    (fit,) = smem_rmw.fit(rows)
    assert fit["lowering"] == "owned" and fit["rows"] == 8
    assert abs(fit["per_clk"] - 4.0) < 1e-3 and abs(fit["half_warps"] - 8.0) < 1e-2 and fit["rms_log_error"] < 1e-3
    # a CTA count per SM that did not fit counts as what ran: 2 asked, 1 fit
    assert smem_rmw.resident_warps({**rows[1], "ctas_per_sm_fit": 1}) == 4
    falling = [row("atomic", t, 1, 8.0 / (t / 32)) for t in (128, 256, 512)]    # more warps, slower: no fit
    with pytest.raises(ValueError, match="do not fit"):
        smem_rmw.fit(falling)


def test_the_h200_smem_rmw_rates_are_the_probes_fit():
    """cake_core/targets/gpus/h200.json's smem_rmw rows are bench/smem_rmw.py's fit of the committed H200 run."""
    import json

    import smem_rmw

    from cake_core.targets import get_gpu
    data = json.loads((ROOT / "bench/results/smem-rmw-h200-2026-12-03.json").read_text())
    assert data["device"] == "NVIDIA H200"
    fitted = {f["lowering"]: (f["per_clk"], f["half_warps"]) for f in smem_rmw.fit(data["rows"])}
    assert {r.lowering: (r.per_clk, r.half_warps) for r in get_gpu("H200").smem_rmw} == fitted


def test_corpus_vs_peers_refuses_a_peer_name_no_chosen_problem_has_before_any_gpu_work():
    # `flash_kmeans` for `flash-kmeans` used to filter every peer out without a word
    p = subprocess.run([sys.executable, str(ROOT / "bench/corpus_vs_peers.py"), "--problems", "kmeans_assign",
                        "--peers", "flash_kmeans"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2, p.stderr
    assert "--peers: no peer flash_kmeans for kmeans_assign; their peers: flash-kmeans, torch" in p.stderr
    assert "gpu:" not in p.stdout


@pytest.mark.parametrize("problem,shapes,package,said", [
    ("knn_build", "knn_build_portfolio", "", "unknown problem `knn_build`; known: "),
    ("knn_topk", "nope", "", "no shape set `nope` of problem `knn_topk`"),
    ("knn_topk", "knn_build_portfolio", "empty", "holds no exported package (no manifest.json)"),
])
def test_the_dispatch_sweep_refuses_bad_input_in_one_line_before_any_gpu_work(problem, shapes, package, said,
                                                                              tmp_path):
    # a problem name that is a portfolio's (knn_build) used to end the sweep in a traceback, after the export
    p = subprocess.run([sys.executable, str(ROOT / "bench/portfolio_dispatch.py"), str(tmp_path / package),
                        "--problem", problem, "--shapes", shapes], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2, p.stderr
    assert said in p.stderr and "Traceback" not in p.stderr
