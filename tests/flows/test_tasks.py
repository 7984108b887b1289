"""Task bodies without a Prefect server: each diagnostic is recorded once, failed programs keep their identity."""
from cake_core.agents.base import Candidate
from cake_core.harness.version import HarnessSpec
from cake_core.problems import get_problem
from tasks.record import Attempt
from tasks.stages import verify

SEED = get_problem("gemm_bf16").seed_text()
SHAPES = [{"M": 96, "N": 80, "K": 72}]


def _attempt(text):
    return Attempt("r", 0, "gemm_bf16", 0, Candidate(text))


def test_verify_records_each_diagnostic_once_and_keeps_the_hash_of_a_failed_program():
    racy = SEED.replace("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n")
    unguarded = SEED.replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)
    passed, stopped = verify.fn([_attempt(SEED), _attempt(racy), _attempt(unguarded), _attempt("def (")],
                                HarnessSpec(), SHAPES)
    assert [a.candidate.text for a in passed] == [SEED, unguarded]
    for a in passed + stopped:
        assert len(a.diagnostics) == len(set(a.diagnostics)), a.diagnostics
    assert [d.rule for d in passed[1].diagnostics] == ["shapes.tail_guard"]    # a warning travels along
    race = stopped[0]
    assert race.outcome.value == "verify_failed" and race.ir_hash and race.features["n_sync"] == 1
    assert {d.rule for d in race.diagnostics} == {"races.smem"}
    assert stopped[1].ir_hash == "" and stopped[1].diagnostics[0].rule == "parse.syntax"
    rows = race.rows()
    assert rows["attempts"][0]["signature"] == "verify:verify_failed:races.smem"
    assert len(rows["diagnostics"]) == len(race.diagnostics)


def test_two_approvals_at_once_get_consecutive_versions(tmp_path, monkeypatch):
    # both approvals read the current version while the other is between its read and its write
    # (a slowed apply): without the decision lock both would become version 1
    import threading
    import time

    from cake_core.harness.proposal import Proposal
    from cake_core.harness.version import HarnessSpec
    from tasks.harness import apply_decision, load_harness, record_proposal

    root = str(tmp_path / "warehouse")
    pids = [record_proposal(root, Proposal("rule", f"runtime:runtime_fault:x{i}", f"rule {i}",
                                           {"id": f"learned_x{i}", "predicate": {"all": [
                                               {"feature": "op.load.guard=False", "op": ">=", "value": i + 1}]},
                                            "message": "unguarded loads fault on ragged shapes"}, {"n": 3}),
                            {"passed": True}, None)
            for i in range(2)]
    real_apply = HarnessSpec.apply

    def slow_apply(self, *a, **k):
        time.sleep(0.3)
        return real_apply(self, *a, **k)

    monkeypatch.setattr(HarnessSpec, "apply", slow_apply)
    got: list = []
    threads = [threading.Thread(target=lambda pid=pid: got.append(apply_decision(root, pid, True, "ok", "t")))
               for pid in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [1, 2]
    spec = load_harness(root)
    assert spec.version == 2 and spec.parent == 1


def test_compact_merges_tables_with_many_batches_and_keeps_every_row(tmp_path):
    from datetime import datetime

    from tasks.stages import compact
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse")
    t = datetime(2026, 11, 29, 10)
    for i in range(9):      # one record() call each, as a run lands them
        wh.append("measurements", [{"attempt_id": f"a{i}", "run_id": "r", "shape": "M=64,N=64,K=64",
                                    "gpu_model": "NVIDIA H200", "timer": "cuda_event", "l2": "cold-clean",
                                    "median_ms": 0.04, "p10_ms": 0.039, "p90_ms": 0.041, "runs": 20, "correct": True,
                                    "max_error": 1e-7, "kind": "search", "measured_at": t}])
    assert len(wh._snapshot("measurements")) == 9
    assert compact.fn(str(tmp_path / "warehouse"), min_files=8) == {"measurements": 9}
    assert len(wh._snapshot("measurements")) == 1
    assert wh.query("select count(*) n from measurements").to_pylist() == [{"n": 9}]
    assert compact.fn(str(tmp_path / "warehouse"), min_files=8) == {}      # nothing left to merge


def test_dispatch_prefers_confirmed_figures(tmp_path):
    from datetime import datetime

    from flows.evolve import _dispatch
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse")
    t = datetime(2026, 11, 29, 10)

    def m(aid, shape, ms, kind):
        return {"attempt_id": aid, "run_id": "r", "shape": shape, "gpu_model": "NVIDIA H200", "timer": "cuda_event",
                "l2": "cold", "median_ms": ms, "p10_ms": ms * 0.99, "p90_ms": ms * 1.01, "runs": 20,
                "correct": True, "max_error": 0.0, "kind": kind, "measured_at": t}
    wh.append("measurements", [m("lucky", "S1", 1.0, "search"), m("lucky", "S1", 1.3, "confirm"),
                               m("other", "S1", 1.1, "search"), m("other", "S2", 2.0, "search")])
    _dispatch(wh, "r", "gemm_bf16", "set")
    got = {r["shape"]: (r["attempt_id"], r["median_ms"]) for r in wh.query("select * from dispatch").to_pylist()}
    assert got == {"S1": ("lucky", 1.3), "S2": ("other", 2.0)}
