"""What the UI shows, without a server: the rows behind the artifacts (from a known warehouse), their Markdown,
the names of runs, a proposal's evidence, and the review form's required fields."""
import pytest

from ui_rows import SHAPES, fill

from tasks import results
from tasks.artifacts import (artifact_key, generation_markdown, leaderboard_markdown, md_table, proposal_markdown,
                             run_name)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui") / "wh"
    fill(root)
    return str(root)


def test_a_generation_counts_its_own_candidates_and_the_best_so_far(root):
    g = results.generation_rows(root, "run-a", 1)
    assert g["attempts"] == 5                 # this generation's, not the run's 10 so far
    assert g["outcomes"] == {"verify_failed": 2, "compile_failed": 1, "measured": 1, "wrong": 1}
    b = g["best"]
    assert (b["attempt_id"], b["basis"], b["measured_ms"]) == ("run-a-att-9", "measured", 0.5)
    assert b["predicted_ms"] == pytest.approx(0.59)
    assert [(s["shape"], s["predicted_ms"], s["measured_ms"], s["correct"]) for s in g["shapes"]] == [
        (SHAPES[0], 1.0, 0.5, True), (SHAPES[1], 2.0, 1.0, True)]
    # generation 0 knows nothing of generation 1's faster kernel
    assert results.generation_rows(root, "run-a", 0)["best"]["attempt_id"] == "run-a-att-4"


def test_a_generation_without_any_kernel_says_so(root):
    g = results.generation_rows(root, "run-b", 0)
    assert g["attempts"] == 5 and g["best"]["attempt_id"] == "run-b-att-19"
    g = results.generation_rows(root, "run-z", 0)
    assert g == {"generation": 0, "attempts": 0, "outcomes": {}, "best": None, "shapes": []}
    md = generation_markdown(g, timed=True)
    assert "No candidate." in md and "No kernel scored yet." in md


def test_the_generation_markdown_shows_outcomes_best_and_shapes(root):
    md = generation_markdown(results.generation_rows(root, "run-a", 1), timed=True)
    assert "# Generation 1" in md and "| verify_failed | 2 |" in md and "| measured | 1 |" in md
    assert "| run-a-att-9 | 1 | tile_m | 0.59 | 0.5 |" in md
    assert f"| {SHAPES[1]} | 2 | correct | 1 | 1 |" in md
    untimed = generation_markdown(results.generation_rows(root, "run-a", 1), timed=False)
    assert "not timed (no GPU)" in untimed and "| 0.5 |" not in untimed.split("## Per shape")[0]


def test_the_leaderboard_puts_the_run_beside_the_hand_written_kernel_and_the_peer(root):
    board = results.leaderboard_rows(root, "run-a")
    assert [(r["source"], r["name"]) for r in board] == [
        ("hand-written", "kmeans_assign_ws.cake"), ("run best", "run-a-att-14"), ("peer", "flash_kmeans")]
    # every score is over the run's headline shape (the peer's tail row ranks nothing, as the run's kernels'):
    # the peer's 0.8 ms against the run best's 1/3 ms, the figure its headline row shows below
    assert [round(r["vs_run_best"], 4) for r in board] == [0.9, 1.0, 2.4]
    shapes = results.shape_rows(root, "run-a")
    assert [(s["shape"], round(s["vs_hand_written"], 4), round(s["vs_peer"], 4)) for s in shapes] == [
        (SHAPES[0], 0.9, 2.4), (SHAPES[1], 0.45, 0.9)]
    md = leaderboard_markdown("run-a", board, shapes, "kernel k14 { }")
    assert "| 1 | kmeans_assign_ws.cake | hand-written | measured | 0.3 | 0.90× | yes |" in md
    assert f"| {SHAPES[0]} | headline | 0.3333 | measured | kmeans_assign_ws.cake | 0.3 | 0.90× | flash_kmeans" in md
    assert "```python\nkernel k14 { }\n```" in md


def test_the_report_series_come_from_the_views(root):
    conv = results.convergence_rows(root, "run-a")
    assert [r["measured_so_far_ms"] for r in conv] == pytest.approx([1.0, 0.5, 1 / 3])
    assert all(r["predicted_so_far_ms"] == pytest.approx(0.54) for r in conv)
    fails = results.failure_rows(root, "run-a")
    assert {r["generation"] for r in fails} == {0, 1, 2} and sum(r["n"] for r in fails) == 12
    assert {"verify: smem_overflow", "check: wrong"} <= {r["cluster"] for r in fails}
    pred = results.prediction_rows(root, "run-a")
    assert len(pred) == 6 and all(r["predicted_ms"] == pytest.approx(2 * r["measured_ms"]) for r in pred)


def test_names_and_keys():
    class Plan:
        problem, shape_set, run_id, cold, session = "gemm_bf16", "gemm_small", "Run_7", True, 0
    assert run_name(Plan, 3) == "gemm_bf16 · gemm_small · harness v3 · cold · Run_7"
    Plan.cold, Plan.session = False, 2
    assert run_name(Plan, 0).endswith("· warm · Run_7 · job 2")
    assert artifact_key("Run_7", "generation") == "run-7-generation"
    assert artifact_key("--a..b", "x") == "a-b-x"
    assert md_table(["a"], [["x|y"]]) == "| a |\n|---|\n| x\\|y |"


def test_a_proposal_shows_its_definition_cluster_examples_and_gate():
    evidence = {"definition": {"text": "shape.k.max_tiles > 1.0", "in_words": "k spans more than one tile",
                               "predicate": {"all": []}},
                "cluster": {"signature": "check:wrong:idx", "n_attempts": 5},
                "examples": [{"attempt_id": f"a{i}", "excerpt": f"  {i} | store(idx[...])"} for i in range(5)],
                "separation": {"failing": 5}, "key": "k1", "gate": {"passed": True}}
    gate = {"passed": False, "refusals": ["gemm_tma.cake would fail: rule r1"], "corpus": {"replays": 61}}
    md = proposal_markdown("p1", "rule", "reject programs where shape.k.max_tiles > 1.0", evidence, {"id": "r1"}, gate)
    assert "# Proposal p1: reject programs where" in md and "**Kind**: rule" in md
    assert "- **Condition**: shape.k.max_tiles > 1.0" in md and "k spans more than one tile" in md
    assert '"signature": "check:wrong:idx"' in md
    assert "## Examples (3 of 5)" in md and "2 | store(idx[...])" in md and "a3" not in md
    assert '"failing": 5' in md                                  # the rest of the evidence
    assert "## Corpus gate: refused" in md and "- gemm_tma.cake would fail: rule r1" in md
    assert '"replays": 61' in md and '"key"' not in md


def test_the_review_form_needs_a_decision_and_a_reason():
    from pydantic import ValidationError
    from tasks.harness import Decision

    assert Decision(decision="reject", reason="too broad").approve is False
    assert Decision(decision="approve", reason="catches 5").approve is True
    for bad in ({}, {"reason": "why"}, {"decision": "approve"}, {"decision": "approve", "reason": ""},
                {"decision": "approve", "reason": "   "}, {"decision": "maybe", "reason": "why"}):
        with pytest.raises(ValidationError):
            Decision(**bad)
    schema = Decision.model_json_schema()
    assert set(schema["required"]) == {"decision", "reason"}
    assert "default" not in schema["properties"]["decision"]


def test_a_decision_without_a_reason_is_refused_and_records_nothing(tmp_path):
    from cake_core.errors import CakeError
    from tasks.harness import apply_decision, decide_proposal
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh")
    wh.append("proposals", [dict(proposal_id="p1", kind="rule", signature="s", title="t", evidence="{}",
                                 payload="{}", gate_report="{}", flow_run_id=None, base_version=0)])
    for decide in (lambda: apply_decision(str(wh.root), "p1", True, " ", "ana"),
                   lambda: decide_proposal("p1", False, "", "ana", str(wh.root))):
        with pytest.raises(CakeError, match="needs a reason"):
            decide()
    assert wh.query("select count(*) as n from decisions").to_pylist() == [{"n": 0}]
    assert apply_decision(str(wh.root), "p1", False, "too broad", "ana") is None
    assert wh.query("select decision, reason from decisions").to_pylist() == [
        {"decision": "rejected", "reason": "too broad"}]


def test_a_ui_task_that_failed_is_a_warning_not_a_stopped_run():
    from prefect.states import Completed, Failed
    from tasks.artifacts import shown

    class Log:
        warnings: list = []

        def warning(self, m):
            self.warnings.append(m)

    log = Log()
    assert shown(log, "the leaderboard", Completed(data={"rows": 3})) == {"rows": 3} and log.warnings == []
    assert shown(log, "the leaderboard", Failed(message="API unreachable")) is None
    assert log.warnings == ["the leaderboard not published: API unreachable"]
