"""The corpus gate's results on disk: a later process's review reads the built-in verdicts and interpreter checks
an earlier one computed, under the same code only; an unreadable entry is computed again; a problem from
outside cake_core keeps its checks in memory."""
from __future__ import annotations

from dataclasses import replace

from cake_core.harness import gate as gate_mod
from cake_core.harness import gate_store
from cake_core.harness.gate import GateCache, gate_shapes
from cake_core.harness.gate_store import GateStore
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem

PROBLEM = get_problem("kmeans_assign")
SEED = parse_program(PROBLEM.seed_text())
SHAPE = gate_shapes(PROBLEM)[0]


def _computed(cache: GateCache, program=SEED, problem=PROBLEM):
    return cache.verify(program, SHAPE), cache.check(program, problem, SHAPE, 0)


def test_a_new_cache_on_the_same_store_reads_what_the_first_computed(tmp_path, monkeypatch):
    diags, chk = _computed(GateCache(store=GateStore(tmp_path)))
    assert chk.correct and len(list(tmp_path.rglob("*.json"))) == 2

    def refuse(*_a, **_k):
        raise AssertionError("computed again: the store was not read")
    monkeypatch.setattr(gate_mod, "verify", refuse)
    monkeypatch.setattr(gate_mod, "check_on_cpu", refuse)
    later = GateCache(store=GateStore(tmp_path))
    assert _computed(later) == (diags, chk) and later.hits == 2 and later.misses == 0


def test_diagnostics_come_back_whole(tmp_path):
    broken = replace(SEED, threads=2048)      # past the CTA's thread limit: verify says so
    first = GateCache(store=GateStore(tmp_path)).verify(broken, SHAPE)
    assert any(d.is_error for d in first)
    again = GateStore(tmp_path).diagnostics((broken.hash, gate_mod.shape_key(SHAPE)))
    assert again == first


def test_other_code_starts_an_empty_store(tmp_path, monkeypatch):
    _computed(GateCache(store=GateStore(tmp_path)))
    monkeypatch.setattr(gate_store, "code_fingerprint", lambda: "other-code")
    fresh = GateCache(store=GateStore(tmp_path))
    _computed(fresh)
    assert fresh.misses == 2 and fresh.hits == 0


def test_an_unreadable_entry_is_computed_again(tmp_path):
    _computed(GateCache(store=GateStore(tmp_path)))
    for f in tmp_path.rglob("*.json"):
        f.write_text("{not json")
    again = GateCache(store=GateStore(tmp_path))
    diags, chk = _computed(again)
    assert again.misses == 2 and chk.correct


def test_a_problem_from_elsewhere_keeps_its_checks_in_memory(tmp_path):
    elsewhere = replace(PROBLEM, source="path /somewhere")
    _computed(GateCache(store=GateStore(tmp_path)), problem=elsewhere)
    assert [p.parent.name for p in tmp_path.rglob("*.json")] == ["verify"]


def test_the_fingerprint_covers_the_code_and_is_stable():
    assert gate_store.code_fingerprint() == gate_store.code_fingerprint()
    assert len(gate_store.code_fingerprint()) == 20
