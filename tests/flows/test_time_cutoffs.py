"""The time stage's cutoff for clear losers (``cake_core.pipeline.policy.LOSER_FACTOR``): computed from the run's
search measurements, carried by the search's timed jobs alone, and without effect on what selection picks."""
from __future__ import annotations

import ast
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.policy import LOSER_FACTOR, loser_cutoffs
from cake_core.pipeline.rows import measurement_rows
from cake_core.pipeline.stages import Binary
from cake_core.pipeline.verdicts import ShapeVerdict, Timing, as_kind
from cake_core.problems import get_problem
from tasks.stages import gate_and_time, on_gpu, search_cutoffs
from warehouse import Warehouse
from warehouse.queries import run_best, search_best_ms, shape_best

SHAPES = [{"M": 128, "N": 64, "K": 64}, {"M": 64, "N": 128, "K": 64}]
K1, K2 = "M=128,N=64,K=64", "M=64,N=128,K=64"
T = datetime(2026, 12, 2, 3)


def _verdict(shape: str, ms: float, runs: int = 20) -> ShapeVerdict:
    return ShapeVerdict(shape, "gpu", Outcome.MEASURED, 1e-6, "", Timing(ms, ms * 0.99, ms * 1.01, runs, "cuda_event",
                                                                         "cold-clean", "NVIDIA H200"))


def _land(wh: Warehouse, run_id: str, attempt_id: str, figures: dict[str, float | tuple[float, int]],
          kind: str = "search") -> None:
    vs = [_verdict(k, *(f if isinstance(f, tuple) else (f,))) for k, f in figures.items()]
    wh.append("measurements", measurement_rows(attempt_id, run_id, as_kind(vs, kind), T))


class _Pool:
    """The GPU runners, stood in for: every job answers at once (1 ms where timed); the jobs are kept."""

    size = 1

    def __init__(self):
        self.jobs, self.lost = [], []

    def run_units(self, method, units, *, batch, skip=lambda key: False, on_answer=lambda key, answer: None):
        out = {}
        for u in units:
            if skip(u.key):
                continue
            job = u.args
            self.jobs.append(job)
            key = ",".join(f"{d}={v}" for d, v in job.shape.items())
            v = _verdict(key, 1.0) if job.time else ShapeVerdict(key, "gpu", Outcome.CHECKED, 1e-6, "not timed")
            out[u.key] = v
            on_answer(u.key, v)
        return out


def _run(root: Path | None = None):
    return SimpleNamespace(plan=SimpleNamespace(problem="gemm_bf16", run_id="r"), problem=get_problem("gemm_bf16"),
                           reps=20, timeout_s=30.0, gpu=_Pool(), search_shapes=SHAPES,
                           warehouse_root=str(root) if root else None)


def _attempts():
    binary = Binary(SimpleNamespace(kernel_name="k"), b"cubin")
    seed = parse_program(get_problem("gemm_bf16").seed_text())     # its strict shape: M = N = 129, K = 65
    return [SimpleNamespace(lowered="ok", binary=binary, program=seed, runs_on=lambda key: True)]


def test_the_cutoff_is_three_times_the_runs_best_searched_median_on_each_shape(tmp_path):
    wh = Warehouse(tmp_path / "warehouse")
    assert search_cutoffs(_run(wh.root)) == {}                          # generation 0: nothing measured, no cutoff
    _land(wh, "r", "a", {K1: 2.0, K2: 4.0})
    _land(wh, "r", "b", {K1: 1.5})
    _land(wh, "r", "b", {K1: 0.5}, kind="confirm")                      # the final stage's: not the search's
    _land(wh, "q", "c", {K1: 0.1, K2: 0.1})                             # another run's
    wh.append("measurements", [{**measurement_rows("d", "r", [_verdict(K2, 0.2)], T)[0], "correct": False}])
    assert search_best_ms(str(wh.root), "r") == {K1: 1.5, K2: 4.0}
    assert LOSER_FACTOR == 3.0
    assert loser_cutoffs({K1: 1.5, K2: 4.0}) == {K1: 4.5, K2: 12.0} == search_cutoffs(_run(wh.root))


def test_the_search_jobs_carry_their_shapes_cutoff_and_the_strict_jobs_none():
    run = _run()
    got = gate_and_time(run, _attempts(), seed=1, cutoffs={K1: 4.5})
    assert [v.kind for v in got[0]] == ["search", "search", "strict"]
    jobs = {(",".join(f"{d}={v}" for d, v in j.shape.items()), j.time): j.cutoff_ms for j in run.gpu.jobs}
    assert jobs == {(K1, True): 4.5, (K2, True): None, ("M=129,N=129,K=65", False): None}


@pytest.mark.parametrize("kind", ["confirm", "held_out", "baseline"])
def test_confirm_held_out_and_baseline_jobs_never_carry_a_cutoff(kind):
    run = _run()
    with pytest.raises(ValueError, match=f"search's timed jobs only \\(these: {kind}\\)"):
        on_gpu(run, _attempts(), SHAPES, 1, drop_failed=False, kind=kind, cutoffs={K1: 4.5})
    with pytest.raises(ValueError, match="these: strict, untimed"):
        on_gpu(run, _attempts(), SHAPES, 1, drop_failed=False, kind="strict", timed=False, cutoffs={K1: 4.5})
    assert run.gpu.jobs == []                                           # refused before any job went out
    got = on_gpu(run, _attempts(), SHAPES, 1, drop_failed=False, kind=kind)
    assert len(got[0]) == 2 and [j.cutoff_ms for j in run.gpu.jobs] == [None, None]


def test_the_final_stage_passes_no_cutoff_to_any_of_its_jobs():
    # confirm, held-out, sweep and baselines go through on_gpu; the peers through GpuSession.peer, which has none
    import inspect

    import tasks.final
    from cake_core.pipeline.execute import GpuSession
    tree = ast.parse(Path(tasks.final.__file__).read_text())
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "on_gpu"]
    assert {next(k.value.value for k in c.keywords if k.arg == "kind") for c in calls} == {"confirm", "held_out",
                                                                                         "sweep", "baseline"}
    assert all(k.arg != "cutoffs" for c in calls for k in c.keywords)
    assert "cutoff_ms" not in inspect.signature(GpuSession.peer).parameters


def test_a_figure_cut_short_is_never_its_shapes_pick_and_still_scores_its_kernel(tmp_path):
    wh = Warehouse(tmp_path / "warehouse")
    root = str(wh.root)
    _land(wh, "r", "best", {K1: 1.0, K2: 1.0})                          # generation 0, every rep
    cut = search_cutoffs(_run(wh.root))
    assert cut == {K1: 3.0, K2: 3.0}
    # generation 1: a loser cut short on both shapes, and a kernel cut short on K1 alone, far faster on K2
    _land(wh, "r", "loser", {K1: (3.6, 3), K2: (3.3, 3)})
    _land(wh, "r", "mixed", {K1: (3.3, 3), K2: 0.2})
    runs = {(r["attempt_id"], r["shape"]): r["runs"] for r in wh.query("select * from measurements").to_pylist()}
    assert runs[("loser", K1)] == runs[("mixed", K1)] == 3 and runs[("mixed", K2)] == 20   # the row says so
    # above the cutoff is above LOSER_FACTOR x that shape's best, so never that shape's pick
    picks = {p["shape"]: p["attempt_id"] for p in shape_best(root, "r")}
    assert picks == {K1: "best", K2: "mixed"}
    # the figure cut short still counts in the kernel's score (a geomean over both shapes): mixed is the best
    scores = {r["attempt_id"]: r["score_ms"] for r in wh.query("select * from kernel_scores").to_pylist()}
    assert scores["mixed"] == pytest.approx((3.3 * 0.2) ** 0.5) and scores["loser"] == pytest.approx((3.6 * 3.3) ** 0.5)
    assert run_best(root, "r")["attempt_id"] == "mixed"
    # and a figure cut short never lowers the next generation's cutoff
    assert search_cutoffs(_run(wh.root)) == {K1: 3.0, K2: pytest.approx(0.6)}
