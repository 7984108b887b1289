"""The interpreter against the oracle, on shapes that are not tile multiples."""
import re

import numpy as np
import pytest

from cake_core.ir import interp, interp_cta
from cake_core.ir.expr import evaluate
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem, list_problems, load_shape_set
from cake_core.runtime.cpu import check_on_cpu


@pytest.mark.parametrize("problem", list_problems(), ids=lambda p: p.name)
def test_seed_reproduces_the_oracle_on_ragged_shapes(problem):
    prog = parse_program(problem.seed_text())
    shapes = load_shape_set(problem, problem.shape_sets[0]).cpu_shapes(problem.cpu_limit)
    ragged = [s for s in shapes if any(v % 32 for v in s.values())]
    assert ragged, "the shape set must hold shapes that are not tile multiples"
    checks = check_on_cpu(prog, problem, shapes, seed=7)
    assert all(c.correct for c in checks), [c.message for c in checks if not c.correct]
    assert max(c.max_error for c in checks) < problem.rtol


def test_wrong_index_is_caught():
    p = get_problem("gemm_bf16")
    wrong = parse_program(p.seed_text().replace("tile(kt, BK), tile(bid.x, BN)", "tile(kt, BK), tile(bid.y, BN)"))
    checks = check_on_cpu(wrong, p, [{"M": 96, "N": 80, "K": 72}], seed=1)
    assert not checks[0].correct and "max rel error" in checks[0].message


def test_unwritten_output_is_caught_by_poison():
    p = get_problem("gemm_bf16")
    half = parse_program(p.seed_text().replace("grid=(cdiv(N, BN), cdiv(M, BM))", "grid=(1, cdiv(M, BM))"))
    checks = check_on_cpu(half, p, [{"M": 64, "N": 130, "K": 32}], seed=1)
    assert not checks[0].correct and "non-finite" in checks[0].message


def test_missing_tail_guard_faults_at_its_line():
    p = get_problem("gemm_bf16")
    text = p.seed_text().replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)
    shape = {"M": 64, "N": 64, "K": 72}
    x = p.make_inputs(shape, np.random.default_rng(0))
    with pytest.raises(interp.InterpFault, match="out-of-bounds read of `a`") as e:
        interp.run(parse_program(text), shape, x, {"c": np.full((64, 64), np.nan, np.float32)})
    assert e.value.node.line == 7
    # the gate refuses the shape before running it: the unguarded tile bounds the kernel's domain
    (c,) = check_on_cpu(parse_program(text), p, [shape], seed=1)
    assert c.refused and not c.correct and "K = 72, not a multiple of 32" in c.message and "line 7" in c.message
    assert c.fault and c.fault_line == 7       # the fault it would be, recorded without running it


def test_unguarded_is_fine_on_tile_multiples():
    p = get_problem("gemm_bf16")
    text = p.seed_text().replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)
    assert check_on_cpu(parse_program(text), p, [{"M": 64, "N": 64, "K": 64}], seed=1)[0].correct


def test_smem_read_before_write_shows_as_nan():
    p = get_problem("gemm_bf16")
    text = p.seed_text().replace("        load(b_s, b[tile(kt, BK), tile(bid.x, BN)])\n", "")
    x = p.make_inputs({"M": 64, "N": 64, "K": 32}, np.random.default_rng(0))
    out = {"c": np.zeros((64, 64), np.float32)}
    interp.run(parse_program(text), {"M": 64, "N": 64, "K": 32}, x, out)
    assert np.isnan(out["c"]).all()


def _run_gemm(text: str, shape: dict[str, int]):
    p = get_problem("gemm_bf16")
    prog = parse_program(text)
    x = p.make_inputs(shape, np.random.default_rng(0))
    from cake_core.runtime.cpu import _poisoned      # the gate's own poisoned (or zeroed) outputs
    return interp.run(prog, shape, x, _poisoned(p, prog, shape, x))


def test_a_grid_past_the_interpreters_launch_bound_faults_with_a_message():
    seed = get_problem("gemm_bf16").seed_text()
    shape = {"M": 64, "N": 64, "K": 64}
    assert np.isfinite(_run_gemm(seed, shape)["c"]).all()          # the twin: the problem's grid runs
    huge = seed.replace("grid=(cdiv(N, BN), cdiv(M, BM))", "grid=(1000000000, cdiv(M, BM))")
    with pytest.raises(interp.InterpFault, match="launches 1,000,000,000 CTAs"):
        _run_gemm(huge, shape)


def test_a_loop_past_the_interpreters_trip_bound_faults_at_its_line():
    seed = get_problem("gemm_bf16").seed_text()
    huge = seed.replace("range(cdiv(K, BK))", "range(cdiv(K, BK) * 100000)")
    with pytest.raises(interp.InterpFault, match="makes 200,000 trips") as e:
        _run_gemm(huge, {"M": 64, "N": 64, "K": 64})
    assert e.value.node.op.value == "for"


REPEATS = """@kernel(target="sm_90a", grid=(cdiv(N, BN),), threads=128, consts={"BN": 64, "R": 1})
def repeats(x: gmem[f32, (N,)], y: gmem[f32, (N,)]):
    r = rmem(f32, (BN,))
    for rep in range(R):
        load(r, x[tile(bid.x, BN)])
    store(y[tile(bid.x, BN)], r)
"""


def _run_repeats(repeats: int, **kw):
    x = np.arange(128, dtype=np.float32)
    y = np.full(128, np.nan, dtype=np.float32)
    prog = parse_program(REPEATS.replace('"R": 1', f'"R": {repeats}'))
    interp.run(prog, {"N": 128}, {"x": x}, {"y": y}, **kw)
    return x, y


def test_a_launch_within_the_step_budget_runs_to_its_last_step():
    # two CTAs of five steps (the rmem, the for, its one trip, the load, the store): 10 is all the budget needs
    x, y = _run_repeats(1)
    assert np.array_equal(x, y)
    x, y = _run_repeats(1, max_steps=10)
    assert np.array_equal(x, y)
    with pytest.raises(interp.InterpFault, match="budget of 9 steps") as e:
        _run_repeats(1, max_steps=9)
    assert e.value.rule == "interp.budget"


def test_a_loop_nest_past_the_launch_budget_faults_at_the_loop_that_spent_it():
    # 30,000 trips a CTA is under the bound on one loop, but two CTAs of them are past the launch's budget
    assert 30_000 <= interp_cta.MAX_LOOP_TRIPS and 2 * 2 * 30_000 > interp.MAX_INTERP_STEPS
    with pytest.raises(interp.InterpFault) as e:
        _run_repeats(30_000)
    assert e.value.rule == "interp.budget"
    assert e.value.node.op.value == "for" and e.value.node.args[0] == "rep"
    msg = str(e.value)
    assert msg.startswith(f"line {e.value.node.line}: the launch ran past the interpreter's budget of "
                          f"{interp.MAX_INTERP_STEPS:,} steps per launch")
    assert "at CTA (1, 0, 0)" in msg and "the loop with the most trips per entry is `rep` (30,000 per entry" in msg


def test_the_budget_fault_names_the_outer_loop_whose_bound_runs_past_the_tiles():
    # the inner loop makes more trips in all, but the outer one is where the bound runs past the problem's tiles
    nested = REPEATS.replace("        load(r, x[tile(bid.x, BN)])\n",
                             "        for j in range(2):\n            load(r, x[tile(bid.x, BN)])\n")
    prog = parse_program(nested.replace('"R": 1', '"R": 30000'))
    x = np.arange(128, dtype=np.float32)
    with pytest.raises(interp.InterpFault) as e:
        interp.run(prog, {"N": 128}, {"x": x}, {"y": np.full(128, np.nan, np.float32)})
    assert e.value.rule == "interp.budget" and e.value.node.args[0] == "rep"
    assert "`rep` (30,000 per entry on this small shape" in str(e.value)
    assert "then `j` at line 5: 2 per entry" in str(e.value), str(e.value)


def test_an_ordinary_fault_keeps_its_rule():
    seed = get_problem("gemm_bf16").seed_text()
    with pytest.raises(interp.InterpFault) as e:
        _run_gemm(seed.replace("range(cdiv(K, BK))", "range(cdiv(K, BK) * 100000)"), {"M": 64, "N": 64, "K": 64})
    assert e.value.rule == "interp.fault"


def test_a_loop_of_heavy_statements_spends_the_budget_by_the_work_it_does():
    # the chunked KDA program with its chunk loop's bound multiplied by 1000 (a fuzz mutant): its statements
    # multiply 64 x 128 tiles and solve 64 x 64 systems, so counted one step each the budget took ~5 s of CPU to
    # spend; each now counts one step more per ELEMENTS_PER_STEP elements (an MMA its multiply-adds over 16)
    prob = get_problem("kda_prefill")
    text = prob.kernel_text("kda_prefill_chunked.cake").replace("for c in range(cdiv(T, BT)):",
                                                                 "for c in range(cdiv(T, BT) * 1000):")
    prog = parse_program(text, "mutant.cake")
    shape = {"B": 1, "T": 64, "H": 1, "DK": 128, "DV": 128}
    x = prob.make_inputs(shape, np.random.default_rng(0))
    env = {**prog.const_env, **shape}
    outs = {p.name: np.zeros(tuple(int(evaluate(d, env)) for d in p.type.shape), np.float32)
            for p in prog.params if p.name not in x}
    with pytest.raises(interp.InterpFault) as e:
        interp.run(prog, shape, {k: v for k, v in x.items() if k in {p.name for p in prog.params}}, outs)
    assert e.value.rule == "interp.budget" and e.value.node.args[0] == "c"
    # a chunk is ~90 statements and loop trips: one step each would allow ~1,100 chunks; the products, the solve
    # and the 64 x 128 tiles' ops cost several steps each, so the budget is spent in far fewer
    trips = int(re.search(r"`c` \([\d,]+ per entry on this small shape, ([\d,]+) in all", str(e.value)).group(1)
                .replace(",", ""))
    assert 100 < trips < 500, str(e.value)
