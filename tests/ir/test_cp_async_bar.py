"""cp_async_bar: the TMA-free producer copy (rows not 16-byte aligned) completing on an mbarrier. Each rule
with a passing and a failing program; the protocol checker finds a missing arrive, wait or proxy fence in
kmeans_assign_unaligned; the interpreter reproduces the oracle on unaligned D."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

SEED = corpus_file("kmeans_assign_unaligned.cake").read_text()
KM = get_problem("kmeans_assign")
# the async rules planted here (test_async_rules checks every async rule is planted somewhere)
PLANTED = ("cp_async_bar.role", "cp_async_bar.shape", "cp_async_bar.layout", "protocol.proxy_fence")

SMALL = '''@kernel(target="sm_90a", grid=(cdiv(N, BM),), threads=256, consts={"BM": 64, "BK": 64})
def copy_rows(x: gmem[bf16, (N, D)], y: gmem[f32, (N, BK)]):
    x_s = smem(bf16, (BM, BK), swizzle=128)
    full = mbarrier(1)
    with role("producer", warps=(0, 4)):
        cp_async_bar(x_s, x[tile(bid.x, BM), tile(0, BK)], bar=full[0])
        arrive(full[0])
    with role("consumer", warps=(4, 8)):
        acc = rmem(f32, (BM, BK))
        wait(full[0], phase=0)
        fence_async()
        wgmma(acc, x_s, x_s, b_major="k", accumulate=False)
        wgmma_wait(0)
        store(y[tile(bid.x, BM), :], acc)
'''


def _rules(text: str) -> list[str]:
    return sorted({d.rule for d in verify(parse_program(text)) if d.is_error})


def test_the_small_program_passes():
    assert _rules(SMALL) == []


def test_outside_a_role_is_refused():
    bad = SMALL.replace("    full = mbarrier(1)\n", "    full = mbarrier(1)\n    cp_async_bar(x_s, x[tile(bid.x, BM), "
                                                      "tile(0, BK)], bar=full[0])\n")
    assert "cp_async_bar.role" in _rules(bad)


def test_a_window_of_another_shape_is_refused():
    assert "cp_async_bar.shape" in _rules(SMALL.replace("tile(bid.x, BM), tile(0, BK)]", "tile(bid.x, BM), tile(0, 32)]"))


def test_a_swizzled_slot_wider_than_one_span_is_refused():
    assert "cp_async_bar.layout" in _rules(SMALL.replace('"BK": 64}', '"BK": 128}'))


def test_the_seed_passes_the_verifier_on_unaligned_shapes():
    shapes = list(KM.shape_set("kmeans_assign_unaligned").shapes) + [{"B": 4, "N": 100000, "K": 1000, "D": 100}]
    assert not [(d.rule, d.message) for d in verify(parse_program(SEED), shapes=shapes) if d.is_error]


def test_a_missing_arrive_deadlocks():
    line = "                arrive(full_a[((t - bid.x) // ncta.x * cdiv(K, 2 * BN) + kp) % S])\n"
    assert line in SEED
    assert "protocol.deadlock" in _rules(SEED.replace(line, ""))


def test_a_missing_wait_is_a_read_before_ready():
    line = next(ln for ln in SEED.splitlines(keepends=True) if "wait(full_b[" in ln)
    assert "protocol.read_before_ready" in _rules(SEED.replace(line, "", 1))


def test_an_arrive_before_the_copies_is_a_read_before_ready():
    lines = SEED.splitlines(keepends=True)
    arrive = next(i for i, ln in enumerate(lines) if ln.strip().startswith("arrive(full_a"))
    moved = lines.pop(arrive)
    lines.insert(next(i for i, ln in enumerate(lines) if "cp_async_bar(c_a[" in ln), moved)
    assert "protocol.read_before_ready" in _rules("".join(lines))


def test_a_missing_proxy_fence_is_found():
    fence = "                fence_async()\n"
    i = SEED.index(fence)
    assert _rules(SEED[:i] + SEED[i + len(fence):]) == ["protocol.proxy_fence"]
    assert "protocol.proxy_fence" in _rules(SMALL.replace("        fence_async()\n", ""))


def test_the_interpreter_reproduces_the_oracle_on_unaligned_d():
    from cake_core.runtime.cpu import check_on_cpu
    shapes = KM.shape_set("kmeans_assign_unaligned").cpu_shapes(KM.cpu_limit)
    shapes += [{"B": 2, "N": 200, "K": 300, "D": 100}, {"B": 1, "N": 1, "K": 4, "D": 3}]
    checks = check_on_cpu(parse_program(SEED), KM, shapes, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


M256 = corpus_file("kmeans_assign_unaligned_m256.cake").read_text()


def test_the_256_point_tile_seed_passes_the_verifier_and_reproduces_the_oracle():
    from cake_core.runtime.cpu import check_on_cpu
    shapes = list(KM.shape_set("kmeans_assign_unaligned").shapes) + [{"B": 4, "N": 100000, "K": 1000, "D": 100}]
    assert not [(d.rule, d.message) for d in verify(parse_program(M256), shapes=shapes) if d.is_error]
    small = KM.shape_set("kmeans_assign_unaligned").cpu_shapes(KM.cpu_limit)
    small += [{"B": 2, "N": 600, "K": 300, "D": 100}, {"B": 1, "N": 1, "K": 4, "D": 3}]  # 3 tiles of 256, 1 point
    checks = check_on_cpu(parse_program(M256), KM, small, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_the_256_point_tile_seed_fails_for_the_right_reason_when_broken():
    from cake_core.runtime.cpu import check_on_cpu
    shape = [{"B": 2, "N": 600, "K": 300, "D": 100}]
    off = M256.replace("argmin_bias(best3, arg3, acc7, csq_b[g % S], base=(2 * kp + 1) * BN, limit=K)",
                       "argmin_bias(best3, arg3, acc7, csq_b[g % S], base=2 * kp * BN, limit=K)")
    (c,) = check_on_cpu(parse_program(off), KM, shape, seed=7)       # the b tile's columns named as the a tile's
    assert not c.correct and "farther" in c.message, c.message
    unstored = M256.replace("            store(out[t // cdiv(N, BM), tile(t % cdiv(N, BM) * 4 + 3, BM // 4)], arg3)\n", "")
    (c,) = check_on_cpu(parse_program(unstored), KM, shape, seed=7)   # the last 64 points of each tile unwritten
    assert not c.correct and "non-finite" in c.message, c.message
    wait_b = next(ln for ln in M256.splitlines(keepends=True) if "wait(full_b[" in ln)
    assert "protocol.read_before_ready" in _rules(M256.replace(wait_b, "", 1))
