"""The analytic model: wave tails, pipelining, latency, launch cost, and a refit that changes predictions."""
from __future__ import annotations

import pytest
from model_fixtures import gemm_variants, measured, seed

from cake_core.model.analytic import AnalyticModel, combine
from cake_core.model.base import NotEnoughData, Sample
from cake_core.model.features import extract

M = AnalyticModel("H200")


def test_combine_overlaps_as_deep_as_the_pipeline():
    assert combine(3.0, 1.0, 1) == 4.0          # one after the other
    assert combine(3.0, 1.0, 4) == 3.25
    assert combine(1.0, 3.0, 1e9) == pytest.approx(3.0)


def test_a_tail_wave_costs_a_wave():
    """132 SMs x 2 CTAs fill the GPU; one CTA more adds a wave: at least that CTA's math, alone on its SM."""
    p = seed("gemm_bf16_ws")
    one = extract(p, {"M": 128 * 264, "N": 64, "K": 8192})
    more = extract(p, {"M": 128 * 265, "N": 64, "K": 8192})
    assert one.ctas_per_sm == 2 and (one.full_waves, one.tail_ctas) == (1, 0)
    assert (more.full_waves, more.tail_ctas) == (1, 1)
    t1, t2 = M.predict_features(one), M.predict_features(more)
    assert t2 - t1 >= M.terms(more)["math_cta"] * 1e3 > 0
    assert M.terms(more)["tail"] > 0 and M.terms(one)["tail"] == 0


def test_a_deeper_ring_hides_more_of_the_copies():
    p = seed("gemm_bf16_ws")
    shape = {"M": 4096, "N": 4096, "K": 4096}
    deep, shallow = M.predict_features(extract(p, shape)), M.predict_features(extract(p.with_consts(S=1), shape))
    assert extract(p.with_consts(S=1), shape).stages == 4     # the smem ring is declared stages=4 either way
    from cake_core.ir.text import parse_program
    one_stage = parse_program(p.text().replace("stages=4", "stages=1").replace('"S": 4', '"S": 1'))
    assert M.predict_features(extract(one_stage, shape)) > deep and shallow == deep


def test_small_kernels_pay_launch_and_latency():
    f = extract(seed("tinygemm_splitk"), {"M": 1, "N": 256, "K": 256})
    t = M.terms(f)
    assert t["total"] >= t["launch"] + t["fill"] and t["launch"] == pytest.approx(3.6e-6)
    assert M.predict_features(f) < 0.05


def test_wgmma_beats_the_fma_seed_and_gemm_8192_is_compute_bound():
    big = {"M": 8192, "N": 8192, "K": 8192}
    ws, naive = extract(seed("gemm_bf16_ws_n256"), big), extract(seed("gemm_bf16"), big)
    assert M.predict_features(ws) * 5 < M.predict_features(naive)
    t = M.terms(ws)
    assert t["wave_math"] > t["wave_dram"]          # not memory-bound: operands are re-read from L2


def test_refit_changes_the_predictions_of_the_atom_it_fits():
    shapes = [{"M": 2048, "N": 2048, "K": 2048}, {"M": 4096, "N": 4096, "K": 4096}]
    progs = gemm_variants()[:4]                                             # wgmma only
    samples = measured(progs, shapes, lambda p, s: 2.0 * M.predict([Sample.of(p, s)])[0], "r1")
    refit = M.update(samples)
    assert refit.version != M.version and refit.scale == {"wgmma": pytest.approx(2.0)}
    before, after = M.predict(samples), refit.predict(samples)
    assert after == pytest.approx(2.0 * before)
    fma = [Sample.of(seed("gemm_bf16"), shapes[0])]
    assert refit.predict(fma) == pytest.approx(M.predict(fma))              # another atom: unchanged
    assert M.scale == {}                                                     # update returns a new model


def test_refit_refuses_too_few_measurements():
    s = [Sample.of(seed("gemm_bf16_ws"), {"M": 256, "N": 256, "K": 256}, measured_ms=0.01)]
    with pytest.raises(NotEnoughData, match="needs 3 measured samples of one MMA atom; got 1"):
        M.update(s)
