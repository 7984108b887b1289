"""Roles as coroutines on the interpreter: the ws GEMM against the oracle on ragged shapes, deadlocks as faults."""
from pathlib import Path

from cake_core.ir.text import parse, parse_program
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

SEED = corpus_file("gemm_bf16_ws.cake").read_text()
# ragged against the 128 x 64 tiles and the 64-wide K tiles, inside TMA's domain (N and K multiples of 8)
RAGGED = [{"M": 130, "N": 72, "K": 200}, {"M": 64, "N": 64, "K": 64}, {"M": 200, "N": 136, "K": 520},
          {"M": 1, "N": 8, "K": 8}]


def test_ws_gemm_reproduces_the_oracle_on_ragged_shapes():
    checks = check_on_cpu(parse_program(SEED), get_problem("gemm_bf16"), RAGGED, seed=11)
    assert all(c.correct for c in checks), [c.message for c in checks]


def test_wrong_ring_slot_is_caught_by_the_oracle():
    text = SEED.replace("wgmma(acc, a_s[kt % S], b_s[kt % S])", "wgmma(acc, a_s[(kt + 1) % S], b_s[kt % S])")
    checks = check_on_cpu(parse_program(text), get_problem("gemm_bf16"), [{"M": 64, "N": 64, "K": 512}], seed=1)
    assert not checks[0].correct


def test_deadlock_faults_at_the_wait_with_every_role():
    text = SEED.replace("phase=(kt // S + 1) % 2", "phase=kt // S % 2")
    checks = check_on_cpu(parse_program(text), get_problem("gemm_bf16"), [{"M": 64, "N": 64, "K": 64}], seed=1)
    assert checks[0].fault and checks[0].fault_line == 9
    assert "deadlock" in checks[0].message and "role consumer waits on full[0]" in checks[0].message


def test_ws_seed_round_trips_and_role_syntax_errors_are_located():
    prog = parse_program(SEED)
    assert prog.text() == SEED and parse_program(prog.text()) == prog
    bad = SEED.replace('with role("producer", warps=(0, 4), regs=40):', 'with role("producer", regs=40):')
    d = next(d for d in parse(bad).diagnostics if d.rule == "parse.arity")
    assert d.line == 7 and "warps=" in d.message
    bad = SEED.replace("bar=full[kt % S])", "bar=full[kt % S][0])", 1)
    assert any(d.rule == "parse.type" and d.line == 11 for d in parse(bad).diagnostics)
