"""Tactics, the tactic agent and the cost model."""
import numpy as np

from cake_core.agents.base import Context
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import TACTICS, apply, drop_guards, occupancy, retile, retune
from cake_core.ir.features import features
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.model.analytic import AnalyticModel
from cake_core.model.features import extract
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

GEMM = get_problem("gemm_bf16")
SEED = parse_program(GEMM.seed_text())


WS = parse_program(GEMM.best_texts()[0])      # the warp-specialized TMA + wgmma GEMM: knobs S and G


def test_tactics_are_pure_and_produce_valid_ir():
    rng = np.random.default_rng(0)
    applied = 0
    for name in TACTICS:
        for prog in (SEED, WS):
            before = prog.text()
            out = apply(name, prog, rng)
            assert prog.text() == before, name          # the input is never changed
            if isinstance(out, Refused):
                assert out.reason, name
                continue
            applied += 1
            assert out.hash != prog.hash, name
            assert parse_program(out.text()) == out


def test_retune_moves_one_schedule_knob_and_leaves_tile_sizes_alone():
    assert isinstance(apply("retune", SEED, np.random.default_rng(0)), Refused)   # BM, BN, BK only: retile's job
    seen = set()
    for i in range(20):
        out = retune(WS, np.random.default_rng(i))
        changed = {k: v for k, v in out.consts if WS.const_env[k] != v}
        assert len(changed) == 1 and not next(iter(changed)).startswith("B")
        k, v = changed.popitem()
        cur = WS.const_env[k]
        assert v in ((cur - 1, cur + 1) if cur < 8 else (cur // 2, cur * 2))
        seen.add(k)
        if k == "G":      # the tile-order group is a pure performance knob: the program stays valid
            assert not [d for d in verify(out, shapes=[{"M": 4096, "N": 4096, "K": 4096}]) if d.is_error]
    assert seen == {"G"}              # S is a ring's depth: restage moves it with its buffers' stages


def test_occupancy_asks_for_another_cta_count_that_fits_and_leaves_setmaxnreg_programs_alone():
    assert isinstance(apply("occupancy", WS, np.random.default_rng(0)), Refused)   # setmaxnreg roles own their SM
    seen = set()
    for i in range(20):
        out = occupancy(SEED, np.random.default_rng(i))              # 256 threads: up to 8 fit, 4 offered
        assert out.ctas_per_sm in (0, 2, 3, 4) and out.ctas_per_sm != SEED.ctas_per_sm
        assert out.body == SEED.body and out.consts == SEED.consts
        seen.add(out.ctas_per_sm)
        assert not [d for d in verify(out) if d.is_error]
    assert seen == {2, 3, 4}
    assert features(SEED)["ctas_per_sm"] == 0 and features(out)["ctas_per_sm"] == out.ctas_per_sm   # clusterable
    again = occupancy(occupancy(SEED, np.random.default_rng(0)), np.random.default_rng(1))
    assert again.ctas_per_sm in (0, 2, 3, 4)
    big = parse_program(SEED.text().replace("threads=256", "threads=1024"))
    assert occupancy(big, np.random.default_rng(0)).ctas_per_sm == 2   # 2048 / 1024: 2 is the only change


def test_drop_guards_sets_the_feature():
    assert features(drop_guards(SEED, np.random.default_rng(0)))["unguarded_load"] is True
    assert features(SEED)["unguarded_load"] is False


def test_retile_moves_one_constant_to_a_neighbour():
    out = retile(SEED, np.random.default_rng(3))
    changed = {k for k, v in out.consts if SEED.const_env[k] != v}
    assert len(changed) == 1
    k = changed.pop()
    assert out.const_env[k] in (SEED.const_env[k] * 2, SEED.const_env[k] // 2)


def test_agent_is_deterministic_under_a_seed_and_skips_seen():
    a = TacticAgent(5).propose(GEMM, Context(0, 1, 6))
    b = TacticAgent(5).propose(GEMM, Context(0, 1, 6))
    assert [c.text for c in a] == [c.text for c in b]
    hashes = {parse_program(c.text).hash for c in a}
    assert len(hashes) == len(a)
    c = TacticAgent(5).propose(GEMM, Context(0, 1, 6, seen=hashes))
    assert not hashes & {parse_program(x.text).hash for x in c}


def test_generation_zero_starts_from_the_seed():
    cands = TacticAgent(0).propose(GEMM, Context(0, 0, 4))
    assert cands[0].tactic == "seed" and cands[0].text == GEMM.seed_text()


def _work(program, shape):
    """Total FLOPs and gmem bytes read over the grid, as the feature walk charges them."""
    f = extract(program, shape)
    return ((f.tensor_flops + f.fma_flops) * f.ctas,
            (f.read_bytes_load + f.read_bytes_cp_async + f.read_bytes_tma) * f.ctas)


def test_cost_model_charges_rereads_of_small_tiles():
    shape = {"M": 4096, "N": 4096, "K": 4096}
    (big_f, big_b), (small_f, small_b) = _work(SEED, shape), _work(SEED.with_consts(BM=16, BN=16), shape)
    assert small_b > 3 * big_b
    assert big_f == small_f == 2 * 4096 ** 3
    m = AnalyticModel("H200")
    assert m.estimate(SEED.with_consts(BM=16, BN=16), shape).ms > m.estimate(SEED, shape).ms


def test_every_cost_class_has_a_hook_and_every_op_declares_one():
    from cake_core.ir.opdef import CostClass
    from cake_core.ir.ops import REGISTRY
    from cake_core.model.charges import HOOKS
    assert set(HOOKS) == set(CostClass)
    assert all(isinstance(d.cost, CostClass) for d in REGISTRY.values())


def test_an_ops_cost_follows_its_declared_class(monkeypatch):
    # the walk charges each op by its declaration's class: declaring load FREE drops the seed's bytes
    import dataclasses

    from cake_core.ir import registry
    from cake_core.ir.opdef import CostClass
    from cake_core.ir.ops import Op
    from cake_core.model import walk
    shape = {"M": 1024, "N": 1024, "K": 1024}
    before = _work(SEED, shape)
    free_load = dict(registry.REGISTRY)
    free_load[Op.LOAD] = dataclasses.replace(free_load[Op.LOAD], cost=CostClass.FREE)
    monkeypatch.setattr(walk, "REGISTRY", free_load)
    after = _work(SEED, shape)
    assert after[0] == before[0] and after[1] < before[1]


def test_cost_model_covers_every_seed_and_wgmma_beats_fma():
    from pathlib import Path
    from cake_core.problems import list_problems
    m = AnalyticModel("H200")
    for p in list_problems():
        shape = dict(zip(p.dims, [97] * len(p.dims)))
        if "k" in shape:
            shape["k"] = 10
        assert m.estimate(parse_program(p.seed_text()), shape).ms > 0
    ws = parse_program(corpus_file("gemm_bf16_ws.cake").read_text())
    big = {"M": 4096, "N": 4096, "K": 4096}
    assert m.estimate(ws, big).ms < m.estimate(SEED, big).ms / 5


def test_generation_zero_offers_the_best_known_programs():
    cands = TacticAgent(0).propose(GEMM, Context(0, 0, 6, known=GEMM.best_texts()))
    assert [c.tactic for c in cands[:4]] == ["seed", "best-known", "best-known", "best-known"]
    assert [parse_program(c.text).name for c in cands[1:4]] == ["gemm_bf16_ws_n256", "gemm_bf16_persistent",
                                                                "gemm_bf16_ws"]
    assert len(cands) == 6
