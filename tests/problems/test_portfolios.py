"""The shape portfolios (bench/import_portfolios.py wrote them): each loads as its problem's shape set, holds
distinct shapes, carries its provenance, and holds out exactly the seeded share the importer records."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cake_core.problems import get_problem

ROOT = Path(__file__).resolve().parents[2]
PORTFOLIOS = [("kmeans_assign", "kmeans_portfolio", 123), ("knn_topk", "knn_build_portfolio", 109),
              ("knn_search", "knn_build_portfolio", 111), ("knn_search", "knn_search_portfolio", 177),
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
    assert held == imp.held_out_of(problem, name, keys) == imp.held_out_of(problem, name, keys)
    assert abs(len(held) - imp.HOLD_OUT * rows) <= 1
    other = imp._held_out(keys, name + "_other")
    assert other != held, "the draw depends on the set's name"


def test_the_whole_build_portfolio_keeps_the_held_out_rows_of_knn_topks():
    # knn_search's build set holds knn_topk's rows (B = 1; N is M there) and the 2 batched rows it lacks: a row
    # has one role in both, so a row searched in one is never held out in the other
    topk = get_problem("knn_topk").shape_set("knn_build_portfolio")
    whole = get_problem("knn_search").shape_set("knn_build_portfolio")
    role = {(s["Q"], s["N"], s["D"], s["k"]): r for s, r in zip(topk.shapes, topk.roles)}
    ones = [(s, r) for s, r in zip(whole.shapes, whole.roles) if s["B"] == 1]
    assert len(ones) == len(topk.shapes) == len(whole.shapes) - 2
    assert all(role[(s["Q"], s["M"], s["D"], s["k"])] == r for s, r in ones)
    assert whole.roles.count("held_out") == topk.roles.count("held_out") == 16


def test_self_searches_are_the_sources_self_search_and_build_rows():
    # search: the source's self_search column (12 rows, 12 shapes); build: its `build` rows, exactly those with
    # Q == M (58 rows, 57 shapes)
    for name, count in (("knn_search_portfolio", 12), ("knn_build_portfolio", 57)):
        s = get_problem("knn_search").shape_set(name)
        selfs = [x for x in s.shapes if x["S"] == 1]
        assert len(selfs) == count and all(x["Q"] == x["M"] for x in selfs)
    build = get_problem("knn_search").shape_set("knn_build_portfolio")
    assert all(x["S"] == (1 if x["Q"] == x["M"] else 2) for x in build.shapes)
    assert {x["B"] for x in build.shapes} == {1, 2}


def test_every_source_row_of_the_knn_portfolios_is_a_row_of_knn_search():
    # the source's labels are one per row (112 build rows, 198 search rows); a shape that repeats keeps its rows'
    # labels joined with "+": every label is there once, none left out
    import csv
    p = get_problem("knn_search")
    for name, count in (("knn_build_portfolio", 112), ("knn_search_portfolio", 198)):
        with (p.shapes_dir / f"{name}.csv").open() as f:
            labels = [x for r in csv.DictReader(f) for x in r["label"].split("+")]
        assert len(labels) == len(set(labels)) == count
        assert f"({count} rows)" in (p.shapes_dir / f"{name}.md").read_text()
