"""Kernel domains (ir.domain): the bounds derived from the corpus kernels, the refusal of a shape outside
them before anything runs (the CPU gate, `cake run`), and correct answers inside them."""
from __future__ import annotations


import pytest
from typer.testing import CliRunner

from cake_core.errors import CakeError
from cake_core.ir.domain import domain_violations, extent_limit, kernel_domain
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu, run_file
from cake_core.problems import corpus_file

KNN = get_problem("knn_topk")
KDA_DECODE = get_problem("kda_decode")
SPLIT_PP = parse_program(corpus_file("knn_topk_split_pp.cake").read_text(), "knn_topk_split_pp.cake")


def _bounds(name: str) -> set[str]:
    return {b.text() for b in kernel_domain(parse_program(corpus_file(name).read_text(), name))}


def test_the_topk_kernels_bound_k_by_kmax_and_d_by_their_tiles():
    assert _bounds("knn_topk_split_pp.cake") == {"k <= 16", "D <= 128", "2 * D % 16 == 0"}
    assert _bounds("knn_topk.cake") == {"k <= 16"}           # the naive seed loops over D, keeps 16 per query
    assert "D <= 128" in _bounds("kmeans_assign_ws.cake")
    assert _bounds("gemm_bf16.cake") == set()                # guarded tiles over every dimension: no bound


def test_a_large_k_is_refused_with_the_bound_and_its_line():
    shape = {"Q": 130, "N": 300, "D": 64, "k": 40}
    (d,) = domain_violations(SPLIT_PP, shape)
    assert d.rule == "domain.extent" and d.is_error
    assert "k = 40 > 16" in d.message and "tile(0, KMAX)" in d.message and d.line == 83
    (c,) = check_on_cpu(SPLIT_PP, KNN, [shape], seed=1)
    assert c.refused and not c.correct and c.check == "" and "k = 40 > 16" in c.message


def test_d_past_the_tiles_and_misaligned_rows_are_refused():
    rules = sorted(d.rule for d in domain_violations(SPLIT_PP, {"Q": 64, "N": 300, "D": 136, "k": 8}))
    assert rules == ["domain.extent", "domain.extent"]         # q and db are both read up to D = 128 only
    q, db = domain_violations(SPLIT_PP, {"Q": 64, "N": 300, "D": 100, "k": 8})      # one per TMA-copied tensor
    for d, name in ((q, "q"), (db, "db")):
        assert d.rule == "domain.tma_stride" and f"`{name}`" in d.message
        assert "2 * D = 200, not a multiple of 16" in d.message


def test_an_aligned_shape_inside_the_domain_is_accepted_and_correct():
    shape = {"Q": 136, "N": 2200, "D": 120, "k": 16}          # k at KMAX, D two tiles with a tail of 56
    assert domain_violations(SPLIT_PP, shape) == []
    (c,) = check_on_cpu(SPLIT_PP, KNN, [shape], seed=3)
    assert c.correct and not c.refused, c.message


def test_accesses_under_a_branch_the_shape_does_not_take_do_not_bound_it():
    # kmeans_update_smem stores tile(0, KMAX) of the clusters only when K <= KMAX, else adds into all of them
    prog = parse_program(corpus_file("kmeans_update_smem.cake").read_text())
    assert extent_limit(prog, "sums", 1, {"B": 1, "N": 100, "K": 40, "D": 64}) == 1024     # K <= KMAX: the store
    assert extent_limit(prog, "sums", 1, {"B": 1, "N": 100, "K": 2000, "D": 64}) is None   # K > KMAX: `:`
    for K in (40, 2000):
        assert domain_violations(prog, {"B": 1, "N": 100, "K": K, "D": 64}) == []


def test_a_bound_from_a_loop_with_a_static_range():
    text = corpus_file("knn_topk.cake").read_text().replace(
        "    store(idx[tile(bid.x, BQ), tile(0, KMAX)], top_i)",
        "    for j in range(2):\n        store(idx[tile(bid.x, BQ), tile(j, 8)], top_i)")
    prog = parse_program(text)
    assert extent_limit(prog, "idx", 1, {"Q": 8, "N": 8, "D": 8, "k": 4}) == 16      # tiles 0 and 1 of 8
    assert domain_violations(prog, {"Q": 8, "N": 64, "D": 8, "k": 16}) == []
    assert "k = 17 > 16" in domain_violations(prog, {"Q": 8, "N": 64, "D": 8, "k": 17})[0].message


def test_run_file_refuses_before_running_with_the_formatted_diagnostic(tmp_path):
    path = tmp_path / "pp.cake"
    path.write_text(corpus_file("knn_topk_split_pp.cake").read_text())
    with pytest.raises(CakeError, match=r"pp.cake:83:\d+: error\[domain.extent\].*k = 40 > 16"):
        run_file(path, "knn_topk", [{"Q": 130, "N": 300, "D": 64, "k": 40}])
    (c,) = run_file(path, "knn_topk", [{"Q": 130, "N": 300, "D": 64, "k": 12}])
    assert c.correct, c.message


def test_cake_run_prints_the_refusal_and_exits_1(tmp_path):
    from cake_cli.main import app

    path = tmp_path / "pp.cake"
    path.write_text(corpus_file("knn_topk_split_pp.cake").read_text())
    r = CliRunner().invoke(app, ["run", str(path), "--cpu", "--problem", "knn_topk", "--shape", "Q=64,N=300,D=64,k=40"])
    assert r.exit_code == 1
    assert "domain.extent" in r.output and "k = 40 > 16" in r.output and "Traceback" not in r.output


DEEP = parse_program(corpus_file("kmeans_assign_ws_deep.cake").read_text(), "kmeans_assign_ws_deep.cake")


def test_a_loop_capped_by_min_bounds_the_dimension_at_its_cap():
    # kmeans_assign_ws_deep loops over D in min(cdiv(D, BK), 8) tiles of 64: D past 512 is never read
    assert "D <= 512" in {b.text() for b in kernel_domain(DEEP)}
    shape = {"B": 1, "N": 300, "K": 256}
    assert domain_violations(DEEP, {**shape, "D": 512}) == []
    x, c = domain_violations(DEEP, {**shape, "D": 520})
    assert x.rule == c.rule == "domain.extent"
    assert "D = 520 > 512" in x.message and "`x`" in x.message and "tile(dk, BK) at line 14" in x.message
    assert "`c`" in c.message
    # the same loop to cdiv(D, BK) covers every D; one that stops a tile short is no bound (the gate finds it
    # wrong: it is a mistake, not a domain)
    text = corpus_file("kmeans_assign_ws_deep.cake").read_text()
    for stop in ("cdiv(D, BK)", "cdiv(D, BK) - 1"):
        prog = parse_program(text.replace("min(cdiv(D, BK), 8)", stop))
        assert extent_limit(prog, "x", 2, {**shape, "D": 1000}) is None
        assert domain_violations(prog, {**shape, "D": 1000}) == []


def test_the_exported_domain_refuses_what_the_capped_loop_never_reads():
    from cake_core.export.dispatcher_template import domain_refusal
    from cake_core.export.routes import domain_data

    data = domain_data(DEEP, ("B", "N", "K", "D"))
    (x_ext,) = [e for e in data["extents"] if e["param"] == "x" and e["dim"] == "D"]
    assert x_ext["accesses"] == [{"end": 512, "when": []}]
    consts = DEEP.const_env
    assert domain_refusal(data, {"B": 2, "N": 256, "K": 512, "D": 480}, consts) == ""
    assert domain_refusal(data, {"B": 2, "N": 256, "K": 512, "D": 576}, consts).startswith("D = 576 > 512")


def test_the_deep_kmeans_kernel_is_correct_across_d_tails_on_the_interpreter():
    km = get_problem("kmeans_assign")
    shapes = [{"B": 2, "N": 200, "K": 300, "D": 200}, {"B": 1, "N": 64, "K": 132, "D": 480},
              {"B": 1, "N": 130, "K": 132, "D": 48}]
    for c in check_on_cpu(DEEP, km, shapes, seed=5):
        assert c.correct and not c.refused, c.message


def test_a_grid_past_cuda_s_y_and_z_limits_is_refused_before_a_launch():
    # grid=(H, B): B CTAs along y, at most 65535; the same B along x launches (x: 2^31 - 1)
    prog = parse_program(KDA_DECODE.seed_text(), "kda_decode.cake")
    ok = {"B": 65535, "H": 4, "DK": 128, "DV": 128}
    assert [d for d in domain_violations(prog, ok) if d.rule == "domain.grid"] == []
    (d,) = [d for d in domain_violations(prog, {**ok, "B": 65536}) if d.rule == "domain.grid"]
    assert d.is_error and "B = 65536 > 65535" in d.message and "y dimension" in d.message
    swapped = parse_program(KDA_DECODE.seed_text().replace("grid=(H, B", "grid=(B, H"), "swapped.cake")
    assert [d for d in domain_violations(swapped, {**ok, "B": 65536}) if d.rule == "domain.grid"] == []


def test_the_exported_domain_refuses_a_grid_past_cuda_s_limits_as_ir_domain_does():
    from cake_core.export.dispatcher_template import domain_refusal
    from cake_core.export.routes import domain_data

    prog = parse_program(KDA_DECODE.seed_text(), "kda_decode.cake")
    data = domain_data(prog, KDA_DECODE.dims)
    assert {"axis": "y", "extent": "B", "max": 65535} in data["grid"]
    for b in (1, 65535, 65536, 100000):
        shape = {"B": b, "H": 4, "DK": 128, "DV": 128}
        assert bool(domain_refusal(data, shape, prog.const_env)) == bool(domain_violations(prog, shape)), b
    assert domain_refusal(data, {"B": 65536, "H": 4, "DK": 128, "DV": 128}, prog.const_env) == \
        "its grid's y dimension B = 65536 > 65535, the most CUDA launches along it"
