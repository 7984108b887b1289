"""What the CLI draws: best figures that mean what they say, tables readable at 80 columns and piped."""
import io
from datetime import datetime

import pyarrow as pa
from rich.console import Console

from cake_cli.display import LiveProgress, best_text, print_result, summary_table
from warehouse import Warehouse


def _m(aid, shape, ms, kind="search"):
    return {"attempt_id": aid, "run_id": "r", "shape": shape, "gpu_model": "NVIDIA H200", "timer": "cuda_event",
            "l2": "cold", "median_ms": ms, "p10_ms": ms * 0.99, "p90_ms": ms * 1.01, "runs": 20, "correct": True,
            "max_error": 0.0, "kind": kind, "measured_at": datetime(2026, 11, 29)}


def _a(aid, gen, outcome, predicted=None):
    return dict(attempt_id=aid, run_id="r", generation=gen, problem="gemm_bf16", ir_hash=f"h{aid}", ir_text="k",
                agent="tactic", harness_version=0, stage="check", outcome=outcome, predicted_ms=predicted)


def _console(width=80):
    buf = io.StringIO()
    return Console(file=buf, width=width, color_system=None, highlight=False), buf


def test_best_is_the_geomean_of_a_kernel_measured_on_every_shape(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    wh.append("attempts", [_a(x, 0, "measured", 1.0) for x in "abc"])
    wh.append("measurements", [_m("a", "S1", 1.0), _m("a", "S2", 4.0),      # geomean 2.0
                               _m("b", "S1", 0.5), _m("b", "S2", 16.0),     # geomean 2.83; fastest single shape
                               _m("c", "S1", 0.1)])                          # not measured on every shape
    p = LiveProgress(tmp_path / "wh", "r").refresh()
    assert abs(p.best_ms - 2.0) < 1e-9
    assert best_text(p, timed=True).startswith("2 ms (geomean")
    assert "nothing timed" in best_text(p, timed=False)
    assert best_text(LiveProgress(tmp_path / "none", "r").refresh(), timed=False).startswith("nothing timed (CPU run")


def test_cpu_run_shows_its_best_predicted_time_and_that_nothing_was_timed(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    wh.append("attempts", [_a("a", 0, "checked", 2.5), _a("b", 0, "verify_failed"), _a("c", 1, "checked", 0.8),
                           _a("d", 1, "filtered", 0.1),      # filtered: never passed a check, not a best
                           _a("e", 2, "wrong", 0.05), _a("f", 2, "checked", 1.2)])
    p = LiveProgress(tmp_path / "wh", "r").refresh()
    assert p.best_predicted_ms == 0.8 and p.predicted == {0: 2.5, 1: 0.8, 2: 1.2}
    text = best_text(p, timed=False)
    assert text.startswith("predicted 0.8 ms, from 2.5 ms in generation 0 (cost model")
    assert "nothing timed" in text
    con, buf = _console()
    con.print(summary_table(p, timed=False))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "best predicted" in out and "0.8 ms" in out and "2.5 ms" in out
    assert "checked=1, verify_failed=1" in out and "…" not in out


def test_wide_results_become_records_that_keep_every_id_whole():
    pid = "prop-rule-races.smem-0123456789abcdef0123456789abcdef"
    wide = pa.table({"proposal_id": [pid, pid + "x"], "kind": ["rule", "tactic"], "status": ["pending"] * 2,
                     "title": ["reject unguarded smem reads of ragged tiles " * 3] * 2,
                     "evidence": ['{"attempts": 12}'] * 2, "gate_report": ['{"passed": true}'] * 2,
                     "created_at": [datetime(2026, 11, 29, 12)] * 2})
    for width in (80, 120):
        con, buf = _console(width)
        print_result(con, wide)
        out = buf.getvalue()
        assert pid in out and pid + "x" in out, out
        assert max(len(line) for line in out.splitlines()) <= width
        assert "-[ row 1 ]" in out and "proposal_id" in out and "gate_report" in out


def test_narrow_results_stay_a_table():
    con, buf = _console()
    print_result(con, pa.table({"outcome": ["checked", "verify_failed"], "n": [5, 3]}))
    out = buf.getvalue()
    assert "outcome" in out and "verify_failed" in out and "-[ row" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
