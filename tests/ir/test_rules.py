"""Every verifier rule: the seed passes it, and a planted mistake fails with its id at the right line."""
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.verify import RULES
from cake_core.problems import get_problem

SEED = get_problem("gemm_bf16").seed_text()
LOAD_A = "load(a_s, a[tile(bid.y, BM), tile(kt, BK)])"

# rule id -> (old, new, line of the diagnostic)
PLANTED = {
    "types.redefined": ("b_s = smem(bf16, (BK, BN))", "a_s = smem(bf16, (BK, BN))", 4),
    "types.view_rank": (LOAD_A, "load(a_s, a[tile(bid.y, BM)])", 7),
    "types.dtype": ("a_s = smem(bf16, (BM, BK))", "a_s = smem(f16, (BM, BK))", 7),
    "shapes.extent": (LOAD_A, "load(a_s, a[tile(bid.y, BM), tile(kt, BN)])", 7),
    "shapes.static": ("a_s = smem(bf16, (BM, BK))", "a_s = smem(bf16, (M, BK))", 3),
    "shapes.symbols": (LOAD_A, "load(a_s, a[tile(bid.y, BM), tile(kk, BK)])", 7),
    "mma.shape": ("acc = rmem(f32, (BM, BN))", "acc = rmem(f32, (BM, BK))", 10),
    "mma.operand_dtype": ("a_s = smem(bf16, (BM, BK))", "a_s = smem(f16, (BM, BK))", 10),
    "mma.atom_target": ('target="sm_90a"', 'target="sm_100a"', 10),
    "mma.sync_tiling": ('"BK": 32', '"BK": 24', 10),
    "resources.smem": ('"BK": 32', '"BK": 1024', 4),
    "resources.threads": ("threads=256", "threads=100", 1),
    "resources.ctas_per_sm": ("threads=256", "threads=256, ctas_per_sm=9", 1),
    "resources.registers": ('threads=256, consts={"BK": 32, "BM": 64, "BN": 64}',
                            'threads=64, consts={"BK": 32, "BM": 128, "BN": 128}', 1),
    "resources.rmem_split": ("threads=256", "threads=96", 5),
    "target.grid": ("grid=(cdiv(N, BN), cdiv(M, BM))", "grid=(0, cdiv(M, BM))", 1),
    "target.unknown": ('target="sm_90a"', 'target="sm_80"', 1),
    "shapes.tail_guard": (LOAD_A, "load(a_s, a[tile(bid.y, BM), tile(kt, BK)], guard=False)", 7),
    # a window stopped at a limit, copied unguarded (tests/ir/test_window_offsets.py has the TMA case)
    "shapes.offset_window": (LOAD_A, "load(a_s, a[tile(bid.y, BM, limit=M), tile(kt, BK)], guard=False)", 7),
    "races.smem": ("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n", 7),
    "control.loop_step": ("for kt in range(cdiv(K, BK)):", "for kt in range(0, cdiv(K, BK), 0):", 6),
    "shapes.launch_symbols": (LOAD_A, "load(a_s, a[tile(bid.y, BM), tile(kt % num_sms, BK)])", 7),
    # an elementwise op on a swizzle-128 tile of 64-byte rows (tests/ir/test_swizzle_layout.py has the rest)
    "layout.swizzle": ("a_s = smem(bf16, (BM, BK))", "a_s = smem(bf16, (BM, BK), swizzle=128)\n    fill(a_s)", 4),
}
EXTRA = {"mma.atom_target": ("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="wgmma")'),
         "mma.sync_tiling": ("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')}


def test_every_rule_has_a_planted_failure():
    core = {r for r in RULES if RULES[r].check.__module__ == "cake_core.ir.rules"}  # others: test_async_rules...
    assert core | {"target.unknown"} == set(PLANTED)


def test_the_seed_passes_every_rule():
    assert check_text(SEED, "seed.cake") == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    old, new, line = PLANTED[rule_id]
    assert old in SEED
    text = SEED.replace(old, new)
    if rule_id in EXTRA:
        text = text.replace(*EXTRA[rule_id])
    diags = check_text(text, "planted.cake")
    hits = [d for d in diags if d.rule == rule_id]
    assert hits, f"{rule_id} did not fire; got {[d.rule for d in diags]}"
    assert hits[0].line == line, hits[0].format("planted.cake", text)
    assert hits[0].hint


def test_race_witness_names_both_sides():
    text = SEED.replace(*PLANTED["races.smem"][:2])
    d = next(d for d in check_text(text) if d.rule == "races.smem")
    assert "write-after-read" in d.message
    assert any("read: mma at line 10 (trip 1)" in w for w in d.witness)
    assert any("write: load at line 7 (trip 2)" in w for w in d.witness)


def test_tail_guard_names_a_witness_shape_and_stays_quiet_on_multiples():
    from cake_core.ir.text import parse_program
    from cake_core.ir.verify import verify
    text = SEED.replace(LOAD_A, "load(a_s, a[tile(bid.y, BM), tile(kt, BK)], guard=False)")
    prog = parse_program(text)
    d = [d for d in verify(prog, shapes=[{"M": 64, "N": 64, "K": 64}, {"M": 96, "N": 80, "K": 72}])
         if d.rule == "shapes.tail_guard"]
    assert len(d) == 1 and d[0].line == 7 and d[0].severity.value == "warning"
    assert "shape M=96, N=80, K=72: M = 96 is not a multiple of 64" in d[0].witness[0]
    assert not [d for d in verify(prog, shapes=[{"M": 64, "N": 64, "K": 64}]) if d.rule == "shapes.tail_guard"]


def test_if_block_round_trips_runs_and_lowers():
    import numpy as np
    from cake_core.ir.text import parse, parse_program
    from cake_core.lower.cuda import lower
    from cake_core.runtime.cpu import check_on_cpu
    text = SEED.replace("        mma(acc, a_s, b_s)\n", "        if kt * BK < K:\n            mma(acc, a_s, b_s)\n")
    prog = parse_program(text)
    assert prog.text() == text and check_text(text) == []
    assert check_on_cpu(prog, get_problem("gemm_bf16"), [{"M": 96, "N": 80, "K": 72}], 0)[0].correct
    skip_all = parse_program(text.replace("if kt * BK < K:", "if kt < 0:"))
    assert not check_on_cpu(skip_all, get_problem("gemm_bf16"), [{"M": 64, "N": 64, "K": 64}], 0)[0].correct
    assert "if ((kt * BK) < K) {" in lower(prog).value.source
    bad = parse(text.replace("if kt * BK < K:", "if kt < K and kt < M:"))
    assert [d.rule for d in bad.diagnostics] == ["parse.if"] and bad.diagnostics[0].line == 10


def test_mma_sync_seed_passes_tiling():
    text = SEED.replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')
    assert check_text(text) == []
