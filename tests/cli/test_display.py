"""The live display's best-so-far is a kernel's geomean over the shapes, not the smallest shape's time."""
from datetime import datetime

from cake_cli.display import RunProgress, best_text
from warehouse import Warehouse


def _m(aid, shape, ms, kind="search"):
    return {"attempt_id": aid, "run_id": "r", "shape": shape, "gpu_model": "NVIDIA H200", "timer": "cuda_event",
            "l2": "cold", "median_ms": ms, "p10_ms": ms * 0.99, "p90_ms": ms * 1.01, "runs": 20, "correct": True,
            "max_error": 0.0, "kind": kind, "measured_at": datetime(2026, 11, 29)}


def test_best_is_the_geomean_of_a_kernel_measured_on_every_shape(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    wh.append("measurements", [_m("a", "S1", 1.0), _m("a", "S2", 4.0),      # geomean 2.0
                               _m("b", "S1", 0.5), _m("b", "S2", 16.0),     # geomean 2.83; fastest single shape
                               _m("c", "S1", 0.1)])                          # not measured on every shape
    p = RunProgress(tmp_path / "wh", "r").refresh()
    assert abs(p.best_ms - 2.0) < 1e-9
    assert best_text(p, timed=True).startswith("2 ms (geomean")
    assert "not timed" in best_text(p, timed=False)
