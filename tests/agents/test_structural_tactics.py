"""Structural tactics: each applies to at least two problems of the corpus (the result verifies, passes the
CPU gate on ragged shapes and lowers; nvcc compiles it where nvcc is present), and refuses where its
precondition does not hold, with the reason."""
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused, count_ops
from cake_core.agents.tactics import STRUCTURAL, TACTICS, apply
from cake_core.ir.ops import Op
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

# CPU shapes with tails in every dimension, aligned for TMA (16-byte rows) where a chain reaches TMA
SHAPES = {
    "gemm_bf16": [{"M": 128, "N": 128, "K": 64}, {"M": 100, "N": 136, "K": 40}, {"M": 200, "N": 72, "K": 160}],
    "tinygemm": [{"M": 1, "N": 128, "K": 128}, {"M": 8, "N": 96, "K": 160}, {"M": 16, "N": 136, "K": 72}],
    "kmeans_assign": [{"B": 1, "N": 128, "K": 128, "D": 64}, {"B": 2, "N": 150, "K": 100, "D": 40},
                      {"B": 1, "N": 130, "K": 260, "D": 128}],
    "knn_topk": [{"Q": 128, "N": 160, "D": 64, "k": 10}, {"Q": 40, "N": 150, "D": 40, "k": 10},
                 {"Q": 130, "N": 300, "D": 128, "k": 16}],
}
# tactic -> the chain that leads to the form it rewrites, per problem it applies to (at least two each)
CHAINS = {
    "mma_sync": {"gemm_bf16": [], "tinygemm": []},
    "warp_specialize": {"gemm_bf16": [], "tinygemm": [], "kmeans_assign": [], "knn_topk": []},
    "tma": {"gemm_bf16": ["warp_specialize"], "kmeans_assign": ["warp_specialize"], "knn_topk": ["warp_specialize"]},
    "resident": {"kmeans_assign": ["warp_specialize", "tma"], "knn_topk": ["warp_specialize"]},
    "batch_wgmma": {"kmeans_assign": ["warp_specialize", "tma", "resident"],
                    "knn_topk": ["warp_specialize", "tma", "resident"]},
    "pipeline_wgmma": {"gemm_bf16": ["warp_specialize", "tma"], "tinygemm": ["warp_specialize"],
                       "kmeans_assign": ["warp_specialize"]},
    "pingpong": {"kmeans_assign": ["warp_specialize", "tma", "resident", "batch_wgmma"],
                 "knn_topk": ["warp_specialize", "tma", "resident", "batch_wgmma"]},
    "consumer_warpgroups": {"gemm_bf16": ["warp_specialize", "tma"], "kmeans_assign": ["warp_specialize", "tma"],
                            "knn_topk": ["warp_specialize", "tma"], "tinygemm": ["warp_specialize"]},
    "persistent": {"gemm_bf16": ["warp_specialize", "tma"], "kmeans_assign": ["warp_specialize", "tma", "resident"],
                   "knn_topk": ["warp_specialize", "tma"]},
    "split_k": {"gemm_bf16": ["warp_specialize", "tma"], "tinygemm": ["warp_specialize", "tma"]},
    "cluster_split": {"knn_topk": ["warp_specialize", "tma", "resident", "batch_wgmma"],
                      "tinygemm": ["warp_specialize", "tma"], "gemm_bf16": ["warp_specialize", "tma", "pipeline_wgmma"]},
    "group_tiles": {"gemm_bf16": ["warp_specialize", "tma"], "tinygemm": [], "kmeans_assign": []},
    "multicast": {"gemm_bf16": ["warp_specialize", "tma"],
                  "kmeans_assign": ["warp_specialize", "tma", "resident", "batch_wgmma", "pingpong"]},
    "prefetch": {"gemm_bf16": [], "tinygemm": [], "kmeans_assign": [], "knn_topk": []},
}
# what each tactic must have done to the op counts (an op that appears, or one that goes)
EFFECT = {
    "mma_sync": lambda before, after, p: "mma_sync" in p.text() and "mma_sync" not in before.text(),
    "warp_specialize": lambda b, a, p: a.get("wgmma", 0) > 0 and a.get("role") == 2 and a.get("cp_async_bar", 0) > 0,
    "tma": lambda b, a, p: a.get("tma_load", 0) > 0 and a.get("cp_async_bar", 0) < b.get("cp_async_bar", 0),
    "resident": lambda b, a, p: a.get("mbarrier", 0) == b.get("mbarrier", 0) + 1,
    "batch_wgmma": lambda b, a, p: a.get("for", 0) > b.get("for", 0),
    "pipeline_wgmma": lambda b, a, p: "wgmma_wait(1)" in p.text(),
    "pingpong": lambda b, a, p: a.get("role") == 3 and a.get("mbarrier") == b.get("mbarrier") + 2,
    "persistent": lambda b, a, p: "ncta.x" in p.text() and "num_sms" in p.text(),
    "consumer_warpgroups": lambda b, a, p: abs(p.threads - b.threads) == 128 and count_ops(p.body) == count_ops(b.body)
    and {v for k, v in p.consts if dict(b.consts)[k] != v} in ({64}, {128}),
    "split_k": lambda b, a, p: a.get("atomic_add", 0) == 1 and a.get("store", 0) == b.get("store", 0) - 1,
    "cluster_split": lambda b, a, p: a.get("cluster") == 1 and a.get("cluster_sync") == 2 and a.get("store", 0) == 0
    and (a.get("topk_cluster_merge", 0) + a.get("acc_cluster_reduce", 0)) == b.get("store"),
    "group_tiles": lambda b, a, p: "G * cdiv(N, BN)" in p.text() or "G * cdiv(N, BN))" in p.text(),
    "multicast": lambda b, a, p: a.get("cluster") == 1 and "multicast=3)" in p.text() and a.get("if", 0) > b.get("if", 0),
    "prefetch": lambda b, a, p: a.get("cp_async", 0) >= 2 * b.get("load", 0) - 2 * a.get("load", 0)
    and a.get("cp_async_wait", 0) == 3 and a.get("smem", 0) > b.get("smem", 0),
}


def _bounds(prob):
    return {d: max(s[d] for s in SHAPES[prob]) for d in get_problem(prob).dims}


def _chain(prob, names, seed=0):
    p = parse_program(get_problem(prob).seed_text())
    rng = np.random.default_rng(seed)
    for t in names:
        out = apply(t, p, rng, _bounds(prob))
        assert not isinstance(out, Refused), f"{t} refused on {prob}: {out.reason}"
        p = out
    return p


def test_every_structural_tactic_is_tested_on_two_problems_and_documented():
    # grid_loop applies to role-free kernels whose outer loop carries nothing: among the built-ins, the MoE
    # seed's expert and intermediate-tile loops; tests/agents/test_grid_loop.py shows it on both and on a toy.
    # registers moves tiles no mma or transpose reads: the gated-delta-rule and MoE seeds' (tests/agents/
    # test_registers.py), none of these four problems'; drop_syncs removes barriers that order nothing, which
    # these four problems' seeds do not have (tests/agents/test_drop_syncs.py: the KDA, MoE and mha seeds)
    # split_state cuts a scan state's columns: the KDA seeds' and chunked kernels' (tests/agents/test_split_state.py)
    # grid_order moves the coordinate along the largest tensor's contiguous axis to x: the grouped GEMM's seed,
    # the KDA kernels after split_state and the evolved KDA decode kernel (tests/agents/test_grid_order.py)
    # hoist_loads issues top-level loads early: the KDA decode kernels and the varlen seed
    # (tests/agents/test_hoist_loads.py)
    assert set(CHAINS) == set(STRUCTURAL) - {"grid_loop", "registers", "drop_syncs", "split_state", "grid_order",
                                             "hoist_loads"}
    import importlib
    for name, probs in {**CHAINS, "grid_loop": {"moe": [], "moe/it": ["grid_loop"]},
                              "registers": {"kda_decode": [], "kda_prefill": [], "moe": []},
                              "drop_syncs": {"kda_decode": [], "mha": []},
                              "split_state": {"kda_prefill": [], "kda_varlen": []},
                              "grid_order": {"grouped_gemm": [], "kda_prefill": ["split_state"]},
                              "hoist_loads": {"kda_decode": ["evolved"], "kda_varlen": []}}.items():
        assert len(probs) >= 2, name
        fn = TACTICS[name]
        module_doc = importlib.import_module(fn.__module__).__doc__ or ""
        doc = (fn.__doc__ or "") if "Before" in (fn.__doc__ or "") else module_doc + (fn.__doc__ or "")
        assert "Before" in doc and "After" in doc and "Precondition" in doc, name


@pytest.mark.parametrize("name,prob", [(t, p) for t, probs in CHAINS.items() for p in probs])
def test_the_tactic_applies_and_the_result_is_a_correct_kernel(name, prob):
    before = _chain(prob, CHAINS[name][prob])
    out = apply(name, before, np.random.default_rng(1), _bounds(prob))
    assert not isinstance(out, Refused), out.reason
    assert parse_program(out.text()) == out                       # round-trips through the text form
    assert EFFECT[name](before, count_ops(out.body), out) if name in ("mma_sync", "pipeline_wgmma", "persistent",
                                                                       "consumer_warpgroups") \
        else EFFECT[name](count_ops(before.body), count_ops(out.body), out), out.text()
    errors = [d for d in verify(out, shapes=SHAPES[prob]) if d.is_error]
    assert not errors, [d.message for d in errors]
    checks = check_on_cpu(out, get_problem(prob), SHAPES[prob], seed=3)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(out, "tactic.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("prob,names", [
    ("kmeans_assign", ["warp_specialize", "tma", "resident", "batch_wgmma", "pingpong", "persistent"]),
    ("gemm_bf16", ["warp_specialize", "tma", "group_tiles", "pipeline_wgmma", "persistent"]),
    ("gemm_bf16", ["warp_specialize", "tma", "consumer_warpgroups", "pipeline_wgmma"]),
    ("knn_topk", ["warp_specialize", "tma", "resident", "batch_wgmma"]),
    ("tinygemm", ["warp_specialize", "tma", "split_k"]),
    ("knn_topk", ["warp_specialize", "tma", "resident", "batch_wgmma", "cluster_split"]),
])
def test_a_chain_of_tactics_compiles_for_sm90a(prob, names, tmp_path):
    from cake_core.lower.compile import compile_kernel
    p = _chain(prob, names)
    assert not [d for d in verify(p, shapes=SHAPES[prob]) if d.is_error]
    assert all(c.correct for c in check_on_cpu(p, get_problem(prob), SHAPES[prob], seed=5))
    comp = compile_kernel(lower(p, "chain.cake").value, arch="sm_90a", cache_dir=tmp_path)
    assert comp.outcome is Outcome.OK, comp.artifacts.get("log", "")[-2000:]
    assert comp.value.resources.spill_bytes <= 64


REFUSALS = [
    ("mma_sync", "gemm_bf16", ["mma_sync"], "no mma with the fma atom"),
    ("mma_sync", "kmeans_update", [], "no mma with the fma atom"),
    ("warp_specialize", "kmeans_update", [], "no mma"),
    ("warp_specialize", "gemm_bf16", ["warp_specialize"], "already has warp roles"),
    ("tma", "gemm_bf16", [], "no cp_async_bar"),
    ("resident", "gemm_bf16", ["warp_specialize", "tma"], "independent of the candidate loop"),
    ("batch_wgmma", "kmeans_assign", ["warp_specialize"], "static trip count"),
    ("pipeline_wgmma", "gemm_bf16", [], "no consumer loop"),
    ("pingpong", "gemm_bf16", ["warp_specialize"], "no loop over candidate tiles"),
    ("pingpong", "kmeans_assign", ["warp_specialize"], "static number of ring slots"),
    ("consumer_warpgroups", "gemm_bf16", [], "0 consumer roles"),
    ("consumer_warpgroups", "kmeans_assign", ["warp_specialize", "tma", "resident", "batch_wgmma", "pingpong"],
     "2 consumer roles"),
    ("persistent", "gemm_bf16", [], "no warp roles"),
    ("persistent", "gemm_bf16", ["warp_specialize", "persistent"], "already walks tiles"),
    ("split_k", "kmeans_assign", ["warp_specialize"], "holds a loop"),
    ("cluster_split", "kmeans_assign", ["warp_specialize"], "no cluster merge for it"),
    ("cluster_split", "gemm_bf16", ["warp_specialize", "persistent"], "persistent tile loop"),
    ("multicast", "gemm_bf16", ["warp_specialize"], "cp.async producers"),
    ("multicast", "knn_topk", ["warp_specialize", "tma"], "one-dimensional grid"),
    ("group_tiles", "knn_topk", [], "not two"),
    ("group_tiles", "gemm_bf16", ["warp_specialize", "tma", "persistent"], "not two"),
]


@pytest.mark.parametrize("name,prob,chain,reason", REFUSALS)
def test_the_tactic_refuses_where_its_precondition_fails(name, prob, chain, reason):
    p = _chain(prob, chain) if prob != "kmeans_update" else parse_program(get_problem(prob).seed_text())
    out = apply(name, p, np.random.default_rng(0), None)
    assert isinstance(out, Refused), f"{name} applied to {prob} after {chain}"
    assert reason in out.reason, out.reason


def test_mma_sync_on_a_kernel_whose_ewise_reads_the_accumulator_is_refused_by_the_lowering():
    """The tactic rewrites the mma alone; the lowering refuses the ewise that reads the fragment layout (the
    failure the harness tests mine a verifier rule from)."""
    p = _chain("kmeans_assign", [])
    out = apply("mma_sync", p, np.random.default_rng(0), None)
    assert not isinstance(out, Refused) and 'atom="mma_sync"' in out.text()
    assert not [d for d in verify(out, shapes=SHAPES["kmeans_assign"]) if d.is_error]
    low = lower(out, "child.cake")
    assert low.outcome is Outcome.COMPILE_FAILED
    assert {d.rule for d in low.diagnostics if d.is_error} == {"lower.acc_layout"}


def test_no_tactic_reads_a_stored_program(monkeypatch):
    """Tactics rewrite the program they are given: reading any problem's kernels/ file fails here."""
    texts = {p: get_problem(p).seed_text() for p in SHAPES}
    stored = {(get_problem(p).root / "kernels").resolve() for p in SHAPES}
    assert all(d.is_dir() for d in stored)
    real_read = Path.read_text
    real_open = open

    def is_stored(file) -> bool:
        return bool(stored & set(Path(str(file)).resolve().parents))

    def guarded_read(self, *a, **k):
        assert not is_stored(self), f"a tactic read {self}"
        return real_read(self, *a, **k)

    def guarded_open(file, *a, **k):
        assert not is_stored(file), f"a tactic opened {file}"
        return real_open(file, *a, **k)

    monkeypatch.setattr(Path, "read_text", guarded_read)
    monkeypatch.setattr("builtins.open", guarded_open)
    rng = np.random.default_rng(7)
    applied = 0
    for prob, text in texts.items():
        p = parse_program(text)
        for _ in range(12):
            for name in STRUCTURAL + ("retile", "restage"):
                out = apply(name, p, rng, _bounds(prob))
                if not isinstance(out, Refused):
                    p, applied = out, applied + 1
    assert applied >= 12


def test_agents_never_name_the_stored_programs():
    src = Path(__file__).parents[2] / "cake_core" / "agents"
    for f in src.glob("*.py"):
        text = f.read_text()
        for word in ("seeds/", "kernels/", "kernel_text", "best_files", "best_texts", "read_text("):
            assert word not in text, f"{f.name} mentions {word}"


def test_a_refusal_names_the_reason_and_an_unchanged_rewrite_is_one():
    seed = parse_program(get_problem("gemm_bf16").seed_text())
    r = apply("tma", seed, np.random.default_rng(0))
    assert isinstance(r, Refused) and "cp_async_bar" in r.reason
    assert isinstance(apply("unroll", seed.with_consts(), np.random.default_rng(0)), (Refused, type(seed)))


def test_the_resident_operand_covers_the_largest_search_shape():
    base = _chain("kmeans_assign", ["warp_specialize", "tma"])
    for d, rd in ((64, 1), (100, 2), (128, 2), (200, 4)):
        out = apply("resident", base, np.random.default_rng(0), {"B": 2, "N": 150, "K": 260, "D": d})
        assert out.const_env["RD"] == rd
    big = apply("resident", base, np.random.default_rng(0), {"B": 2, "N": 150, "K": 260, "D": 300})
    assert isinstance(big, Refused) and "at most 4" in big.reason


def test_a_one_warpgroup_consumer_widens_to_two_over_128_rows_and_back():
    narrow = None
    for seed in range(8):           # warp_specialize draws one or two consumer warpgroups for a 64-row tile
        p = _chain("gemm_bf16", ["warp_specialize", "tma"], seed)
        if p.threads == 256:
            narrow = p
            break
    assert narrow is not None
    wide = apply("consumer_warpgroups", narrow, np.random.default_rng(0), _bounds("gemm_bf16"))
    assert not isinstance(wide, Refused), wide.reason
    cons = next(r for r in wide.body if r.op is Op.ROLE and r.args[0] == "consumer")
    assert (wide.threads, dict(wide.consts)["BM"], cons.args[1]) == (384, 128, (4, 12))
    bars = {n.result: n.attr("arrivals") for n in wide.body if n.op is Op.MBARRIER}
    assert sorted(bars.values(), key=str).count(2) == 1          # `empty`, the one the consumer arrives on
    assert apply("consumer_warpgroups", wide, np.random.default_rng(0), None) == narrow   # and back
    # the same kernel warp_specialize makes when it draws two consumer warpgroups itself (constants aside)
    direct = next(p for p in (_chain("gemm_bf16", ["warp_specialize", "tma"], s) for s in range(8))
                  if p.threads == 384)
    assert wide.with_consts(**dict(direct.consts)) == direct
    assert all(c.correct for c in check_on_cpu(wide, get_problem("gemm_bf16"), SHAPES["gemm_bf16"], seed=2))


def test_a_barrier_that_does_not_count_one_arrival_per_consumer_warpgroup_is_refused():
    p = _chain("gemm_bf16", ["warp_specialize", "tma"], 0)
    assert p.threads == 384 and "arrivals=2" in p.text()
    odd = parse_program(p.text().replace("arrivals=2", "arrivals=3"))
    out = apply("consumer_warpgroups", odd, np.random.default_rng(0), None)
    assert isinstance(out, Refused) and "counts 3 arrivals, not one per consumer warpgroup (2)" in out.reason


def test_ping_pong_alternates_the_consumers_through_turn_barriers():
    p = _chain("kmeans_assign", CHAINS["pingpong"]["kmeans_assign"] + ["pingpong"])
    text = p.text()
    assert 'role("consumer0", warps=(4, 8)' in text and 'role("consumer1", warps=(8, 12)' in text
    assert "wait(turn0[0], phase=(kt + 1) % 2)" in text and "wait(turn1[0], phase=kt % 2)" in text
    assert [n.op for n in p.body if n.op is Op.ROLE] == [Op.ROLE] * 3


@pytest.mark.parametrize("prob", ["kmeans_assign", "knn_topk"])
def test_ping_pong_applies_to_a_persistent_kernel_too(prob):
    # the order evolution takes the two steps in must not matter: a persistent tile loop around the candidate
    # loop keeps counting the candidate tiles across tiles for the turn barriers' parities
    p = _chain(prob, ["warp_specialize", "tma", "resident", "batch_wgmma", "persistent", "pingpong"])
    assert [n.op for n in p.body if n.op is Op.ROLE] == [Op.ROLE] * 3 and "ncta.x" in p.text()
    outer = next(n for n in p.body if n.op is Op.ROLE and n.args[0] == "consumer1").body[0]
    assert outer.op is Op.FOR and len(outer.args) == 4, "the persistent tile loop stays the consumers' outer loop"
    assert "(t - bid.x) // ncta.x * cdiv(" in p.text() and "% 2)" in p.text()
    errors = [d for d in verify(p, shapes=SHAPES[prob]) if d.is_error]
    assert not errors, [d.message for d in errors]
    assert all(c.correct for c in check_on_cpu(p, get_problem(prob), SHAPES[prob], seed=4))


def test_a_producer_that_reads_its_copies_reads_them_a_trip_later_when_the_ring_holds_two_tiles():
    seed = parse_program(get_problem("knn_topk").seed_text()).with_consts(BQ=128)
    # a ring of four slots holds two tiles of the two resident reduction steps (D = 128)
    deep = next(p for p in (apply("warp_specialize", seed, np.random.default_rng(s)) for s in range(20))
                if p.const_env["S"] == 4)
    deep = apply("tma", deep, np.random.default_rng(0))
    out = apply("resident", deep, np.random.default_rng(0), {"D": 128})
    text = out.text()
    assert "for nt in range(cdiv(N, BN) + 1):" in text and "if nt > 0:" in text and "it = (nt - 1) * RD + dt" in text
    for extra in ([], ["persistent"], ["cluster_split"]):
        p = out
        for t in extra:
            p = apply(t, p, np.random.default_rng(0))
            assert not isinstance(p, Refused), p.reason
        assert not [d for d in verify(p, shapes=SHAPES["knn_topk"]) if d.is_error]
        assert all(c.correct for c in check_on_cpu(p, get_problem("knn_topk"), SHAPES["knn_topk"], seed=2)), extra


def test_tma_draws_the_wgmma_n_that_cp_async_pinned_and_leaves_a_free_one_alone():
    from cake_core.agents.tactics import WGMMA_N, wgmma_consts
    ws = _chain("gemm_bf16", ["warp_specialize"])
    assert "BN" in wgmma_consts(ws)[0] and ws.const_env["BN"] == 64      # an N-major b filled by cp.async
    widths = set()
    for seed in range(12):
        out = apply("tma", ws, np.random.default_rng(seed), _bounds("gemm_bf16"))
        assert not isinstance(out, Refused) and "BN" in wgmma_consts(out)[1]
        widths.add(out.const_env["BN"])
        assert not [d for d in verify(out, shapes=SHAPES["gemm_bf16"]) if d.is_error]
    assert widths <= set(WGMMA_N) and len(widths) >= 3
    km = _chain("kmeans_assign", ["warp_specialize"])                    # a K-major b: its N was never pinned
    assert apply("tma", km, np.random.default_rng(0), _bounds("kmeans_assign")).const_env == km.const_env


@pytest.mark.parametrize("prob", ["kmeans_assign", "knn_topk"])
def test_tma_and_resident_give_the_same_kernel_in_either_order(prob):
    # resident first leaves the resident operand's tiles copied by a loop of cp.async before the candidate
    # loop; tma then turns that loop into TMA copies under one expect_tx of all its trips, as when tma came first
    first = _chain(prob, ["warp_specialize", "resident", "tma"])
    assert "cp_async_bar" not in first.text() and "* BD * 2 * RD)" in first.text()
    assert first == _chain(prob, ["warp_specialize", "tma", "resident"])
    assert not [d for d in verify(first, shapes=SHAPES[prob]) if d.is_error]
    assert all(c.correct for c in check_on_cpu(first, get_problem(prob), SHAPES[prob], seed=6))


def test_a_loop_joins_a_copy_group_only_when_it_copies_and_nothing_else_into_one_barrier():
    from cake_core.agents.rewrite import walk_nodes
    from cake_core.agents.tactics_copy import _loop_of_copies
    res = _chain("kmeans_assign", ["warp_specialize", "resident"])
    found = [r for n in walk_nodes(res.body) if n.op is Op.FOR and (r := _loop_of_copies(res, n)) is not None]
    assert [(bar.buf, total) for bar, total in found] == [("x_full", "(BN * BD * 2) * RD")]
    ws = _chain("kmeans_assign", ["warp_specialize"])       # its ring loops also wait and arrive: no such loop
    assert not [n for n in walk_nodes(ws.body) if n.op is Op.FOR and _loop_of_copies(ws, n) is not None]


def _fp32_mma_seed() -> str:
    """The gemm seed with its tiles widened to f32 (the UT transform's and a KDA chunk's f32 products)."""
    text = get_problem("gemm_bf16").seed_text()
    assert "smem(bf16," in text
    return text.replace("smem(bf16,", "smem(f32,")


def test_mma_sync_takes_an_f32_product_as_three_tf32_products():
    p = parse_program(_fp32_mma_seed(), "f32.cake")
    out = apply("mma_sync", p, np.random.default_rng(0), None)
    assert not isinstance(out, Refused), out.reason
    low = lower(out, "f32.cake")
    assert low.ok, low.diagnostics
    assert "cake::mma_sync_tf32x3_rmem_smem<" in low.value.source


def test_mma_sync_puts_every_product_of_the_chunked_kda_prefill_on_the_tensor_cores():
    # the chunk's seven f32 products; the masks, gates and casts around them address the fragments at their
    # coordinates, so the child lowers (and the CPU gate's answers are the FMA kernel's: one semantics)
    chunked = parse_program(get_problem("kda_prefill").kernel_text("kda_prefill_chunked.cake"))
    out = apply("mma_sync", chunked, np.random.default_rng(0), None)
    assert not isinstance(out, Refused), out.reason
    assert out.text().count('atom="mma_sync"') == 7
    low = lower(out, "chunked.cake")
    assert low.ok, [d.message for d in low.diagnostics]
    assert low.value.source.count("cake::mma_sync_tf32x3_rmem_smem<") == 7


def test_mma_sync_leaves_an_operand_outside_smem_or_of_mixed_dtypes_alone():
    mixed = _fp32_mma_seed().replace("b_s = smem(f32,", "b_s = smem(bf16,")
    out = apply("mma_sync", parse_program(mixed, "m.cake"), np.random.default_rng(0), None)
    assert isinstance(out, Refused) and "no fma mma multiplies two smem tiles of one dtype" in out.reason


def test_mma_sync_leaves_a_one_row_accumulator_alone_and_takes_one_whose_rows_a_const_sets():
    # the MoE seed multiplies a token's row (1, BK) by an expert's tile: no atom of 16 rows fits a literal 1, and
    # no knob moves it (the H100 MoE run spent 81 of 160 attempts on such children failing mma.sync_tiling)
    moe = parse_program(get_problem("moe").seed_text())
    out = apply("mma_sync", moe, np.random.default_rng(0), None)
    assert isinstance(out, Refused) and "fixed number of rows that 16" in out.reason
    gemm = get_problem("gemm_bf16").seed_text()
    rows = re.search(r"rmem\(f32, \((\w+), ", gemm).group(1)
    assert not rows.isdigit()                      # a const (BM): retile may move it to a multiple of 16
    out = apply("mma_sync", parse_program(gemm), np.random.default_rng(0), None)
    assert not isinstance(out, Refused) and 'atom="mma_sync"' in out.text()
    literal = parse_program(gemm.replace(f"rmem(f32, ({rows}, ", "rmem(f32, (24, "), "g.cake")
    assert isinstance(apply("mma_sync", literal, np.random.default_rng(0), None), Refused)


def test_mma_sync_rewrites_the_16_bit_products_of_a_kernel_that_has_both():
    bf16 = get_problem("gemm_bf16").seed_text()
    mixed = bf16.replace("    acc = rmem(f32", "    w_s = smem(f32, (BK, BN))\n    acc2 = rmem(f32, (BM, BN))\n"
                                             "    acc = rmem(f32", 1)
    mixed = mixed.replace("        mma(acc, a_s, b_s)", "        mma(acc, a_s, b_s)\n        mma(acc2, acc, w_s)", 1)
    assert mixed.count("mma(") == 2, mixed
    out = apply("mma_sync", parse_program(mixed, "mixed.cake"), np.random.default_rng(0), None)
    assert not isinstance(out, Refused), out.reason
    assert out.text().count('atom="mma_sync"') == 1 and "mma(acc2, acc, w_s)" in out.text()


@pytest.mark.parametrize("name", ["split_k", "cluster_split"])
def test_a_reduction_whose_sum_is_rescaled_is_not_split(name):
    # the warp-specialised attention: its output accumulator is rescaled by the online softmax and its register A
    # computed from an earlier product, so partial sums over shares of the keys do not add up (the gate would see
    # NaN and wrong rows); the GEMM's plain sum of products still splits
    ws = parse_program(get_problem("mha").kernel_text("mha_ws.cake"), "mha_ws.cake")
    out = apply(name, ws, np.random.default_rng(0), None)
    assert isinstance(out, Refused) and "no sum of products over the reduction" in out.reason, out
    plain = _chain("tinygemm" if name == "split_k" else "gemm_bf16", ["warp_specialize", "tma"])
    assert not isinstance(apply(name, plain, np.random.default_rng(0), None), Refused)
