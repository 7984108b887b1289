"""Regions of a portfolio: a seeded, deterministic partition of the searched rows by their dimensions on a log
scale, representatives that span each region (its medoid, then its extremes), held-out rows never grouped."""
from __future__ import annotations

import pytest

from cake_core.pipeline.regions import default_count, plan_regions, region_of
from cake_core.problems.base import ShapeSet, shape_key

DIMS = ("M", "N", "K")


def _set(shapes, held=()):
    rows = list(shapes) + list(held)
    return ShapeSet("p", "gemm_bf16", tuple(rows), tuple(["headline"] * len(shapes) + ["held_out"] * len(held)))


def _keys(shapes):
    return sorted(shape_key(s) for s in shapes)


SMALL = [{"M": m, "N": n, "K": 64} for m in (1, 2, 4) for n in (1024, 2048)]            # decode-like
LARGE = [{"M": m, "N": n, "K": 8192} for m in (4096, 8192) for n in (4096, 8192, 16384)]  # big square-ish


def test_two_planted_groups_become_two_regions_and_every_row_is_in_one():
    rs = plan_regions(_set(SMALL + LARGE), DIMS, count=2, per_region=3, seed=1)
    assert len(rs) == 2
    assert sorted([_keys(r.members) for r in rs]) == sorted([_keys(SMALL), _keys(LARGE)])
    for r in rs:
        assert len(r.representatives) == 3 and set(_keys(r.representatives)) <= set(_keys(r.members))
        assert len(set(_keys(r.representatives))) == 3


def test_the_plan_is_the_same_for_the_same_seed():
    a = plan_regions(_set(SMALL + LARGE), DIMS, count=3, seed=7)
    b = plan_regions(_set(SMALL + LARGE), DIMS, count=3, seed=7)
    assert [(_keys(r.members), _keys(r.representatives)) for r in a] == \
        [(_keys(r.members), _keys(r.representatives)) for r in b]


def test_representatives_start_at_the_medoid_and_then_reach_the_extremes():
    line = [{"M": 2 ** i, "N": 4096, "K": 4096} for i in range(7)]       # M = 1 .. 64 on a log line
    (r,) = plan_regions(_set(line), DIMS, count=1, per_region=3)
    assert [s["M"] for s in r.representatives] == [8, 1, 64] or [s["M"] for s in r.representatives] == [8, 64, 1]


def test_held_out_rows_are_never_grouped_and_go_to_the_nearest_region():
    held = [{"M": 3, "N": 1536, "K": 64}, {"M": 6144, "N": 8192, "K": 8192}]
    rs = plan_regions(_set(SMALL + LARGE, held), DIMS, count=2, seed=1)
    assert all(shape_key(h) not in _keys(r.members) + _keys(r.representatives) for r in rs for h in held)
    assert region_of(rs, held[0]) is region_of(rs, SMALL[0])
    assert region_of(rs, held[1]) is region_of(rs, LARGE[0])
    text = region_of(rs, held[0]).csv(DIMS)
    assert text.startswith("M,N,K,role\n") and "3,1536,64,held_out" in text
    assert text.count("headline") == len(region_of(rs, held[0]).representatives)


def test_the_default_count_and_the_limits():
    assert [default_count(n) for n in (1, 2, 8, 105, 400)] == [1, 1, 2, 8, 15]
    assert len(plan_regions(_set(SMALL[:2]), DIMS, count=5)) <= 2
    (r,) = plan_regions(_set([SMALL[0]] * 1), DIMS)
    assert r.representatives == (SMALL[0],)
    with pytest.raises(ValueError, match="every row is held out"):
        plan_regions(_set([], SMALL[:2]), DIMS)
    with pytest.raises(ValueError, match="per_region"):
        plan_regions(_set(SMALL), DIMS, per_region=0)


def test_a_region_set_sweeps_the_rows_it_does_not_search_and_a_run_never_searches_them(tmp_path):
    from cake_core.pipeline.plan import RunPlan, run_shapes
    from cake_core.problems import get_problem

    rs = plan_regions(_set(SMALL + LARGE), DIMS, count=2, per_region=2, seed=1)
    r = rs[0]
    others = [s for x in rs for s in x.members if shape_key(s) not in _keys(r.representatives)]
    csv = tmp_path / "region.csv"
    csv.write_text(r.csv(DIMS, tuple(others)))
    assert csv.read_text().count(",sweep\n") == len(others) == len(SMALL + LARGE) - 2
    shapes = run_shapes(get_problem("gemm_bf16"), RunPlan(run_id="x", problem="gemm_bf16", shape_set=str(csv)),
                        timed=True)
    assert _keys(shapes.search) == _keys(r.representatives) and _keys(shapes.sweep) == _keys(others)
    assert shapes.held_out == [] and "sweep" in shapes.roles.values()


def test_a_shape_set_with_an_unknown_role_is_refused_with_the_roles_it_may_use(tmp_path):
    from cake_core.problems import get_problem, load_shape_set
    from cake_core.problems.base import ShapeSetError

    csv = tmp_path / "bad.csv"
    csv.write_text("M,N,K,role\n16,16,16,swept\n")
    with pytest.raises(ShapeSetError, match="must be headline, tail, held_out or sweep"):
        load_shape_set(get_problem("gemm_bf16"), str(csv))
