"""scatter_add into a shared-memory tile (a privatised accumulator): verifier rules (the target, the
races around it) and the interpreter against the kmeans_update oracle, best-known program included."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

UPD = get_problem("kmeans_update")

PRIV = '''@kernel(target="sm_90a", grid=(cdiv(N, BN), B), threads=128, consts={"BN": 128, "BD": 32, "KMAX": 64})
def priv(x: gmem[bf16, (B, N, D)], assign: gmem[i32, (B, N)], sums: gmem[f32, (B, K, D)], counts: gmem[i32, (B, K)]):
    acc_s = smem(f32, (KMAX, BD))
    cnt_s = smem(i32, (KMAX,))
    a_s = smem(i32, (BN,))
    x_r = rmem(bf16, (BN, BD))
    ones = rmem(i32, (BN,), fill=1.0)
    load(a_s, assign[bid.y, tile(bid.x, BN)])
    sync()
    for dt in range(cdiv(D, BD)):
        fill(acc_s, value=0.0)
        fill(cnt_s, value=0.0)
        sync()
        load(x_r, x[bid.y, tile(bid.x, BN), tile(dt, BD)])
        scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N)
        scatter_add(cnt_s[:], a_s, ones, base=bid.x * BN, limit=N)
        sync()
        atomic_add(sums[bid.y, tile(0, KMAX), tile(dt, BD)], acc_s)
        if dt == 0:
            atomic_add(counts[bid.y, tile(0, KMAX)], cnt_s)
        sync()
'''


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_the_privatised_program_verifies():
    assert check_text(PRIV, "priv.cake") == []


@pytest.mark.parametrize("drop, needle, what", [
    ("        sync()\n        load(x_r", "scatter_add(acc_s", "atomic-after-write"),          # zeroing not visible
    ("        sync()\n        atomic_add(sums", "atomic_add(sums", "read-after-atomic"),     # sums read too early
])
def test_scatter_into_smem_races_without_a_sync(drop, needle, what):
    text = PRIV.replace(drop, drop.split("\n", 1)[1])
    assert text != PRIV
    d = next(d for d in check_text(text, "priv.cake") if d.rule == "races.smem")
    assert what in d.message and d.line == _line_of(text, needle), d.message


def test_two_scatters_into_one_smem_tile_do_not_race():
    text = PRIV.replace("        scatter_add(cnt_s[:], a_s, ones, base=bid.x * BN, limit=N)\n",
                        "        scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N)\n")
    assert not [d for d in check_text(text, "priv.cake") if d.rule == "races.smem"]


def test_a_window_of_an_smem_target_is_refused():
    text = PRIV.replace("scatter_add(acc_s[:, :]", "scatter_add(acc_s[tile(0, 32), :]")
    d = next(d for d in check_text(text, "priv.cake") if d.rule == "atomic.smem_target")
    assert d.line == _line_of(text, "scatter_add(acc_s") and "acc_s[:, :]" in d.hint


def _interp(text: str, shape: dict) -> tuple[bool, float, str]:
    inputs = UPD.make_inputs(shape, np.random.default_rng(1))
    want = UPD.oracle(inputs)
    out = {"sums": np.zeros((shape["B"], shape["K"], shape["D"]), np.float32),
           "counts": np.zeros((shape["B"], shape["K"]), np.int32)}
    interp.run(parse_program(text, "k.cake"), dict(shape), {k: v for k, v in inputs.items() if k[0] != "_"}, out)
    return UPD.compare(out, want)


@pytest.mark.parametrize("shape", [{"B": 2, "N": 150, "K": 20, "D": 40}, {"B": 1, "N": 33, "K": 7, "D": 9}])
def test_the_interpreter_scatters_into_smem_like_the_oracle(shape):
    ok, err, msg = _interp(PRIV, shape)
    assert ok, msg


@pytest.mark.parametrize("name", UPD.best_files)
def test_the_best_known_programs_verify_and_match_the_oracle_on_the_small_set(name):
    text = corpus_file(name).read_text()
    assert check_text(text, name) == []
    for shape in UPD.shape_set("kmeans_update_small").shapes:
        ok, err, msg = _interp(text, shape)
        assert ok, (shape, msg)


@pytest.mark.parametrize("shape", [
    {"B": 2, "N": 300, "K": 50, "D": 40},     # one CTA per (batch, D-slice): plain stores, 10 chunks
    {"B": 1, "N": 301, "K": 70, "D": 33},     # K > KMAX: the global-atomic branch; points split in 2
    {"B": 1, "N": 1000, "K": 5, "D": 8},      # points split across 4 CTAs, merged with atomics
])
def test_the_smem_program_with_small_tiles_covers_every_branch(shape):
    text = corpus_file("kmeans_update_smem.cake").read_text()
    small = text.replace('"BN": 384, "KMAX": 1024, "SMS": 132', '"BN": 32, "KMAX": 64, "SMS": 4')
    assert small != text
    ok, err, msg = _interp(small, shape)
    assert ok, msg

OWNED = ("kmeans_update_owned.cake", "kmeans_update_owned_w32.cake", "kmeans_update_owned_w8.cake")


@pytest.mark.parametrize("name", OWNED)
def test_the_warp_owned_variants_verify_and_match_the_oracle(name):
    # owner="warp" changes who adds a row, not the sum: the interpreter checks the program around it
    # (ring, branches, merges); the GPU test checks the helper itself
    text = corpus_file(name).read_text()
    assert check_text(text, name) == [] and 'owner="warp"' in text
    small = text.replace('"BN": 384, "KMAX": 1024, "SMS": 132', '"BN": 32, "KMAX": 64, "SMS": 4')
    assert small != text
    for shape in ({"B": 2, "N": 150, "K": 20, "D": 40},    # one CTA per (batch, D-slice), ragged tail
                  {"B": 1, "N": 301, "K": 70, "D": 33},    # K > KMAX: the global-atomic loop
                  {"B": 1, "N": 1000, "K": 5, "D": 8}):    # points split across CTAs, atomic merges
        ok, err, msg = _interp(small, shape)
        assert ok, (shape, msg)
