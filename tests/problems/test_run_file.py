"""`run_file`: the CPU path of `cake run FILE --cpu --problem P --shape ...`."""
from __future__ import annotations

import pytest

from cake_core.errors import CakeError
from cake_core.problems import get_problem
from cake_core.runtime.cpu import run_file


def test_run_file_checks_a_seed(tmp_path):
    p = get_problem("kmeans_assign")
    f = tmp_path / "k.cake"
    f.write_text(p.seed_text())
    checks = run_file(f, "kmeans_assign", [{"D": 20, "B": 2, "N": 70, "K": 90}], seed=1)
    assert [c.shape for c in checks] == ["B=2,N=70,K=90,D=20"] and checks[0].correct


def test_run_file_raises_with_formatted_diagnostics(tmp_path):
    f = tmp_path / "bad.cake"
    f.write_text(get_problem("kmeans_assign").seed_text().replace("limit=K)", "limit=Z)"))
    with pytest.raises(CakeError) as e:
        run_file(f, "kmeans_assign", [{"B": 1, "N": 8, "K": 8, "D": 8}])
    assert "shapes.symbols" in str(e.value) and "bad.cake:" in str(e.value) and "^" in str(e.value)


def test_run_file_refuses_a_wrong_shape_and_a_missing_file(tmp_path):
    f = tmp_path / "k.cake"
    f.write_text(get_problem("knn_topk").seed_text())
    with pytest.raises(CakeError, match="must give exactly Q, N, D, k"):
        run_file(f, "knn_topk", [{"Q": 8, "N": 8}])
    with pytest.raises(CakeError, match="no IR file"):
        run_file(tmp_path / "nope.cake", "knn_topk", [])


def test_run_file_refuses_a_kernel_for_another_problem_and_a_non_positive_shape(tmp_path):
    f = tmp_path / "k.cake"
    f.write_text(get_problem("tinygemm").seed_text())
    with pytest.raises(CakeError, match="does not fit problem kmeans_assign: problem `kmeans_assign` needs "
                                        "parameters x, c_sq, out; parameters a, b are not inputs or outputs"):
        run_file(f, "kmeans_assign", [{"B": 1, "N": 4, "K": 4, "D": 4}])
    with pytest.raises(CakeError, match="dimensions must be ≥ 1"):
        run_file(f, "tinygemm", [{"M": -1, "N": 8, "K": 8}])


def test_a_shape_key_with_a_non_positive_dimension_is_refused():
    from cake_core.problems import ShapeSetError
    from cake_core.problems.base import parse_shape_key
    assert parse_shape_key("M=1,N=2,K=3", ("M", "N", "K")) == {"M": 1, "N": 2, "K": 3}
    with pytest.raises(ShapeSetError, match="dimensions must be ≥ 1"):
        parse_shape_key("M=0,N=2,K=3", ("M", "N", "K"))
