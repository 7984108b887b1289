"""split_k on a role-free kernel (tactics_grid.split_collective): the one reduction loop walks a share of its trips
in each of SPLIT CTAs and the accumulator leaves through atomic adds. It applies to the grouped GEMM's seed (the
split folded into z, the scatter_add of partial sums) and the GEMM seeds (a new grid dimension, the store made an
atomic add), before or after mma_sync; the children pass the verifier and the CPU gate, lower and compile (the
mma_sync accumulator's atomic and scatter adds follow its fragment layout). It refuses, with the reason, a
reduction inside a candidate loop, two accumulators, two reduction loops, an accumulator that feeds anything but
an add into gmem, and another add into gmem that would run once per CTA of the split."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

GROUPED = get_problem("grouped_gemm")
TINY = get_problem("tinygemm")
SHAPES = {"grouped_gemm": [{"T": 4, "topk": 2, "E": 4, "K": 64, "N": 64}, {"T": 13, "topk": 2, "E": 8, "K": 96,
                                                                              "N": 128},
                           {"T": 20, "topk": 3, "E": 8, "K": 72, "N": 100}],
          "tinygemm": [{"M": 1, "N": 128, "K": 128}, {"M": 8, "N": 96, "K": 160}, {"M": 16, "N": 136, "K": 72}]}


def _chain(prob, names, seed=1):
    p = parse_program(get_problem(prob).seed_text())
    for name in names:
        p = apply(name, p, np.random.default_rng(seed))
        assert not isinstance(p, Refused), (name, p.reason)
    return p


def _refusal(p) -> str:
    out = apply("split_k", p, np.random.default_rng(0))
    assert isinstance(out, Refused), out.text()
    return out.reason


@pytest.mark.parametrize("prob, chain", [("grouped_gemm", ["split_k"]), ("grouped_gemm", ["mma_sync", "split_k"]),
                                         ("grouped_gemm", ["split_k", "prefetch", "mma_sync"]),
                                         ("tinygemm", ["split_k"]), ("tinygemm", ["mma_sync", "split_k"])])
def test_the_split_children_verify_pass_the_cpu_gate_and_lower(prob, chain, tmp_path):
    p = _chain(prob, chain)
    split = p.const_env["SPLIT"]
    assert split in (2, 4, 8)
    if prob == "grouped_gemm":      # three dimensions already: the split folds into z
        assert len(p.grid) == 3 and "* SPLIT" in str(p.text().splitlines()[0])
        assert "tile(bid.z // SPLIT, BN)" in p.text() and "bid.z % SPLIT" in p.text()
        assert "scatter_add(" in p.text() and "atomic_add(" not in p.text()
    else:
        assert len(p.grid) == 3 and "atomic_add(" in p.text() and "store(" not in p.text()
    assert parse_program(p.text()) == p
    shapes = SHAPES[prob]
    assert not [d for d in verify(p, shapes=shapes) if d.is_error]
    for q in (p, p.with_consts(SPLIT=3)):        # shares that do not divide the trips: the last CTA's is shorter
        checks = check_on_cpu(q, get_problem(prob), shapes, seed=4, strict=True)
        assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(p, f"{prob}.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]
    if "mma_sync" in chain:
        if prob == "grouped_gemm":
            assert "cake::scatter_add_gmem_mma_acc<" in low.value.source
        else:       # the fragment's store with ADD: atomics at each slot's coordinate
            assert any(ln.strip().startswith("cake::store_gmem_mma_acc<") and ", true>(" in ln
                       for ln in low.value.source.splitlines())
    if shutil.which("nvcc"):
        from cake_core.lower.compile import compile_kernel
        comp = compile_kernel(low.value, arch="sm_90a", cache_dir=tmp_path)
        assert comp.outcome is Outcome.OK, comp.artifacts.get("log", "")[-2000:]


def test_a_split_that_drops_its_shares_offset_is_called_wrong_by_the_cpu_gate():
    # the check that the split is the same sum: every CTA reading the first share instead adds it SPLIT times
    p = _chain("grouped_gemm", ["split_k"])
    wrong = parse_program(p.text().replace("bid.z % SPLIT * cdiv(cdiv(K, BK), SPLIT) + kt", "kt"))
    assert wrong != p
    checks = check_on_cpu(wrong, GROUPED, SHAPES["grouped_gemm"], seed=4, strict=True)
    assert not all(c.correct for c in checks)


def test_it_refuses_a_reduction_whose_operands_are_carried_a_trip_ahead():
    # after prefetch the loop's first tiles are copied before it: a share would start from the first share's
    assert "reads `b_s` before the trip writes it: carried from the trip before" in \
        _refusal(_chain("grouped_gemm", ["prefetch"]))


@pytest.mark.parametrize("prob, reason", [
    ("kmeans_assign", "is nested in a loop: a candidate loop's epilogue would see partial sums"),
    ("knn_topk", "is nested in a loop"),
    ("mha", "the reduction's mmas add into different accumulators"),
    ("moe", "2 loops hold an mma"),
    ("kda_decode", "no loop holds an mma"),
])
def test_it_refuses_seeds_whose_reduction_is_no_plain_sum_of_products(prob, reason):
    assert reason in _refusal(parse_program(get_problem(prob).seed_text()))


def test_it_refuses_an_accumulator_that_feeds_anything_but_an_add_into_gmem():
    text = TINY.seed_text()
    store = next(line for line in text.splitlines() if line.strip().startswith("store("))
    planted = text.replace(store, store.replace("store(", "unary(acc, acc, fn=\"exp\")\n" + " " *
                                                (len(store) - len(store.lstrip())) + "store(", 1))
    assert "writes the accumulator `acc` besides the mma" in _refusal(parse_program(planted))


def test_it_refuses_a_second_add_into_gmem_that_would_run_once_per_cta():
    text = GROUPED.seed_text()
    scatter = next(line for line in text.splitlines() if line.strip().startswith("scatter_add("))
    indent = " " * (len(scatter) - len(scatter.lstrip()))
    planted = text.replace(scatter, scatter + "\n" + indent + "atomic_add(y[tile(0, BM), tile(0, BN)], a_s)")
    assert "adds something other than the accumulator into gmem" in _refusal(parse_program(planted))


def test_it_refuses_to_split_a_split_reduction_again():
    assert "the reduction is split already" in _refusal(_chain("grouped_gemm", ["split_k"]))


def test_the_role_free_split_is_the_same_tactic_name_as_the_warp_specialized_one():
    # one tactic, two forms: the warp-specialized GEMM still takes the role split (a new grid dimension)
    p = _chain("tinygemm", ["warp_specialize", "tma", "split_k"])
    assert any(n.op.value == "role" for n in p.body) and len(p.grid) == 3
