"""Seeded, bounded mutations of every corpus kernel through parse, the verifier (protocol checker included) and
the interpreter: no crash, no hang (``bench/fuzz_verify.py``; its longer run and the 5 s bound are measured
there). A stage that does not finish within STAGE_S is a hang: generous, so that a busy CI machine does not
turn a slow answer into a failure."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from cake_core.problems import corpus_files

STAGE_S = 60.0
MUTANTS = 160


def _fuzz_module():
    spec = importlib.util.spec_from_file_location(
        "fuzz_verify", Path(__file__).resolve().parents[2] / "bench/fuzz_verify.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fuzz():
    return _fuzz_module()


def test_mutants_of_every_corpus_kernel_get_an_answer(fuzz):
    res = fuzz.fuzz(MUTANTS, seed=15, stage_s=STAGE_S)
    c = res["counts"]
    found = [(f["stage"], f["kind"], f["edits"], (f["trace"] or "")[-400:]) for f in res["findings"]]
    assert c["crash"] == 0 and c["hang"] == 0, found
    assert c["mutants"] == MUTANTS
    # the mutations reach both answers: rejected programs and verified ones that the interpreter runs
    assert c["rejected"] > MUTANTS // 4 and c["interpreted"] > 0, c
    # and what verifies also lowers: a refusal there is a case the verifier does not name
    assert c["lower_refused"] == 0, [(m["edits"], m["rule"], m["message"]) for m in res["lower_refused"]]


def test_the_mutations_cover_every_corpus_kernel(fuzz):
    progs = fuzz.corpus()
    seeds = corpus_files("*.cake")
    assert len(progs) == len(seeds) and MUTANTS >= len(progs)


def test_a_crash_and_a_hang_are_findings(fuzz):
    # the harness itself: an exception is a crash, a stage past its bound a hang
    status, trace, _ = fuzz.run_stage(lambda: {}["missing"], 5.0)
    assert status == "crash" and "KeyError" in trace

    def spin():
        while True:
            pass
    status, _, dt = fuzz.run_stage(spin, 0.2)
    assert status == "hang" and dt < 30


def test_a_ring_of_a_million_slots_with_its_wgmma_never_waited_is_answered_in_time():
    """Mutant 35 of `bench/fuzz_verify.py --mutants 1500 --seed 7`: the protocol checker ran 190 s on it (every
    write scanned every read of the unwaited wgmma groups); now every in-flight read is one set lookup."""
    import time
    from cake_core.ir.check import check_text
    from cake_core.problems import corpus_file
    text = corpus_file("gemm_bf16_ws.cake").read_text()
    for old, new in (('"S": 4}', '"S": 2}'), ("a_s = smem(bf16, (BM, BK), stages=4,", "a_s = smem(bf16, (BM, BK), "
                                                                                   "stages=1000000,"),
                     ("            wgmma_wait(0)\n", "")):
        assert old in text, old
        text = text.replace(old, new, 1)
    t0 = time.process_time()
    errors = {d.rule for d in check_text(text, "mutant.cake") if d.is_error}
    assert "resources.smem" in errors
    assert time.process_time() - t0 < STAGE_S
