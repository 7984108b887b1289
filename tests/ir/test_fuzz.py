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
