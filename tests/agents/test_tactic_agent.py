"""The tactic agent: cold starts, deterministic generations, refusals as data, lineage, the niche map, and a
cold CPU run that reaches warp-specialized TMA + wgmma kernels scored by the cost model."""
import math

import numpy as np

from cake_core.agents.base import Context, Scored
from cake_core.agents.search import Archive, niche, tactic_record
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.model.analytic import AnalyticModel
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

KM = get_problem("kmeans_assign")


def test_a_cold_start_offers_the_seed_alone_and_a_warm_one_the_known_programs():
    known = KM.best_texts()
    cold = TacticAgent(1).propose(KM, Context(0, 0, 8, cold=True, known=known))
    hand = {parse_program(t).hash for t in known}
    assert cold[0].tactic == "seed" and not hand & {parse_program(c.text).hash for c in cold}
    assert all(c.lineage and c.tactic != "best-known" for c in cold[1:])
    warm = TacticAgent(1).propose(KM, Context(0, 0, 8, known=known))
    assert [c.tactic for c in warm[:5]] == ["seed"] + ["best-known"] * 4


def test_a_generation_depends_on_the_run_seed_and_its_number_only():
    scored = [Scored(KM.seed_text(), 10.0)]
    a = TacticAgent(3).propose(KM, Context(0, 2, 6, scored=scored))
    b = TacticAgent(3).propose(KM, Context(0, 2, 6, scored=scored))
    assert [c.text for c in a] == [c.text for c in b]
    c = TacticAgent(3).propose(KM, Context(0, 3, 6, scored=scored))
    assert [x.text for x in c] != [x.text for x in a]
    d = TacticAgent(3).propose(KM, Context(0, 2, 6, scored=scored, seen={parse_program(x.text).hash for x in a}))
    assert not {parse_program(x.text).hash for x in a} & {parse_program(x.text).hash for x in d}


def test_refusals_are_recorded_with_their_reason_and_parent():
    agent = TacticAgent(0)
    agent.propose(KM, Context(0, 1, 8, scored=[Scored(KM.seed_text(), 5.0)]))
    assert agent.refusals
    seed_hash = parse_program(KM.seed_text()).hash
    on_seed = [r for r in agent.refusals if r.parent == seed_hash]
    assert on_seed and all(r.reason for r in agent.refusals)
    assert any(r.tactic in ("pingpong", "persistent", "split_k") and "role" in r.reason for r in on_seed)
    assert len(set(agent.refusals)) == len(agent.refusals)


def test_a_child_extends_its_parents_lineage():
    parent = Scored(KM.seed_text(), 5.0, lineage=("warp_specialize",), parent_score=9.0)
    ws = TacticAgent(0).propose(KM, Context(0, 1, 4, scored=[parent]))
    assert ws and all(c.lineage[:1] == ("warp_specialize",) and len(c.lineage) == 2 for c in ws)
    assert all(c.lineage[-1] == c.tactic for c in ws)


def test_a_tactic_wins_only_when_its_child_is_faster_than_the_parent():
    rec = tactic_record([Scored("a", 1.0, ("x", "tma"), 2.0), Scored("b", 3.0, ("tma+retile",), 2.0),
                         Scored("c", 1.0, (), None)])
    assert rec == {"tma": (2, 1), "retile": (1, 0)}


def test_the_archive_keeps_the_best_of_each_niche():
    seed = parse_program(KM.seed_text())
    from cake_core.agents.tactics import apply
    ws = apply("warp_specialize", seed, np.random.default_rng(0))
    a = Archive([Scored(seed.text(), 9.0), Scored(seed.with_consts(BK=32).text(), 8.0), Scored(ws.text(), 20.0)],
                lambda t: niche(parse_program(t)))
    assert len(a.elites) == 3 or len(a.elites) == 2
    assert a.elites[niche(ws)].score == 20.0          # the slower wgmma design keeps its place as a parent
    assert str(niche(ws)).startswith("wgmma/cp_async/")


def test_a_headline_shapes_winner_is_a_parent_even_when_it_is_neither_best_overall_nor_a_niche_elite():
    """Five kernels of one niche: W is slowest by geometric mean (no top-4 place, not its niche's elite) but
    fastest on one headline shape. With W as that shape's winner a quarter of the picks are it; without, none."""
    seed = parse_program(KM.seed_text())
    texts = [seed.with_consts(BD=bd).text() for bd in (4, 8, 16, 32, 64)]
    scored = [Scored(t, 1.0 + i) for i, t in enumerate(texts)]
    assert len({niche(parse_program(t)) for t in texts}) == 1
    w = scored[-1]
    with_w = Archive(scored, lambda t: niche(parse_program(t)), [scored[0], w])
    rng = np.random.default_rng(0)
    picks = [with_w.pick(rng) for _ in range(2000)]
    assert 0.08 < sum(p is w for p in picks) / len(picks) < 0.17      # 1/4 over two winners: 1/8
    without = Archive(scored, lambda t: niche(parse_program(t)))
    rng = np.random.default_rng(0)
    assert not any(without.pick(rng) is w for _ in range(2000))


def _cold_cpu_run(problem, shape_set, generations, population, seed, rank_set=None):
    """Checked on the CPU-sized rows of ``shape_set``; ranked by the cost model on ``rank_set``'s searched
    rows (default: the same rows), as ``cake evolve --check-shapes`` does without a GPU."""
    def rows(name, cpu):
        ss = problem.shape_set(name)
        return [s for s, r in zip(ss.shapes, ss.roles)
                if r != "held_out" and (not cpu or max(s.values()) <= problem.cpu_limit)]
    shapes = rows(shape_set, True)
    ranked = rows(rank_set, False) if rank_set else shapes
    model, agent = AnalyticModel(), TacticAgent(seed)
    ctx = Context(0, 0, population, cold=True, seed=seed, bounds={d: max(s[d] for s in shapes) for d in problem.dims})
    scored, hashes = [], {}
    for g in range(generations):
        ctx.generation = g
        for c in agent.propose(problem, ctx):
            p = parse_program(c.text)
            ctx.seen.add(p.hash)
            if any(d.is_error for d in verify(p, shapes=shapes)) or lower(p, "x").outcome is not Outcome.OK:
                continue
            if not all(x.correct for x in check_on_cpu(p, problem, shapes, g)):
                continue
            pred = model.predict_ms(p, ranked)
            score = math.exp(sum(map(math.log, pred)) / len(pred))
            parent = next((hashes[h] for h in c.parents if h in hashes), None)
            hashes[p.hash] = score
            scored.append(Scored(c.text, score, c.lineage, parent))
        ctx.scored, ctx.tactic_stats = scored, tactic_record(scored)
    return scored


def test_a_cold_cpu_run_reaches_warp_specialized_tma_wgmma_kernels():
    scored = _cold_cpu_run(KM, "kmeans_assign_aligned", generations=6, population=10, seed=1,
                           rank_set="kmeans_assign_large")
    texts = [parse_program(s.text) for s in scored]
    reached = [p for p in texts if niche(p).atom == "wgmma" and niche(p).copy == "tma" and niche(p).consumers >= 1]
    assert reached, sorted({str(niche(p)) for p in texts})
    best = min(scored, key=lambda s: s.score)
    assert best.score < min(s.score for s in scored if s.lineage == ()) / 10      # far faster than the seed at real shapes
    assert "warp_specialize" in "+".join(best.lineage)


def test_the_split_niche_is_split_k_not_any_atomic():
    from cake_core.problems import get_problem
    tiny = get_problem("tinygemm")
    splitk = parse_program(tiny.kernel_text("tinygemm_splitk.cake"))
    assert niche(splitk).split, "partial products of a wgmma accumulator added into C: split-K"
    upd = get_problem("kmeans_update")
    owned = parse_program(upd.kernel_text("kmeans_update_owned.cake"))
    assert "atomic_add" in owned.text() and not niche(owned).split, "a segment sum's atomics are not split-K"
    assert not niche(parse_program(tiny.seed_text())).split
    # the grouped GEMM's seed scatter-adds its accumulator already; its split child is told apart by the reduction
    # loop's trips, which depend on the CTA (its share)
    import numpy as np
    from cake_core.agents.tactics import apply
    grouped = parse_program(get_problem("grouped_gemm").seed_text())
    assert not niche(grouped).split
    assert niche(apply("split_k", grouped, np.random.default_rng(0))).split
