"""The shape portfolios (bench/import_portfolios.py wrote them): each loads as its problem's shape set, holds
distinct shapes, carries its provenance, and holds out exactly the seeded share the importer records."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cake_core.problems import get_problem

ROOT = Path(__file__).resolve().parents[2]
PORTFOLIOS = [("kmeans_assign", "kmeans_portfolio", 123), ("knn_topk", "knn_build_portfolio", 109),
              ("tinygemm", "gemm_decode_portfolio", 80)]


def _importer():
    spec = importlib.util.spec_from_file_location("import_portfolios", ROOT / "bench" / "import_portfolios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("problem, name, rows", PORTFOLIOS)
def test_a_portfolio_is_a_shape_set_of_distinct_shapes_with_its_provenance(problem, name, rows):
    p = get_problem(problem)
    s = p.shape_set(name)
    assert name in p.shape_sets and len(s.shapes) == rows
    keys = [tuple(sorted(x.items())) for x in s.shapes]
    assert len(set(keys)) == len(keys)
    assert set(s.roles) == {"headline", "held_out"}
    assert all(not p.shape_error(x) for x in s.shapes), [x for x in s.shapes if p.shape_error(x)]
    note = (p.shapes_dir / f"{name}.md").read_text()
    assert f"{rows} distinct shapes; {s.roles.count('held_out')} held out" in note
    assert "06efbfaf" in note or "model config" in note or "configs" in note


@pytest.mark.parametrize("problem, name, rows", PORTFOLIOS)
def test_the_held_out_rows_are_the_recorded_seeded_draw(problem, name, rows):
    imp = _importer()
    s = get_problem(problem).shape_set(name)
    keys = [",".join(f"{d}={x[d]}" for d in get_problem(problem).dims) for x in s.shapes]
    held = {k for k, r in zip(keys, s.roles) if r == "held_out"}
    assert held == imp._held_out(keys, name) == imp._held_out(keys, name)
    assert len(held) == round(imp.HOLD_OUT * rows)
    other = imp._held_out(keys, name + "_other")
    assert other != held, "the draw depends on the set's name"


def test_the_decode_portfolio_spans_every_model_layer_and_batch():
    imp = _importer()
    s = get_problem("tinygemm").shape_set("gemm_decode_portfolio")
    assert {x["M"] for x in s.shapes} == set(imp.DECODE_M)
    H, I, h, g, d = imp.MODELS["Llama-3.1-8B"]
    for n, k in (((h + 2 * g) * d, H), (H, h * d), (2 * I, H), (H, I)):
        assert {"M": 1, "N": n, "K": k} in s.shapes
