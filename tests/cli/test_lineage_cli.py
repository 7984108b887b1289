"""`cake lineage`: a real CPU run's kernel traced back to its seed; unknown ids and homes are one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cake_cli.main import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from harness_runs import cpu_run  # noqa: E402

runner = CliRunner()


@pytest.fixture
def warehouse_run(clean_cake_env):
    root = clean_cake_env / "home" / "warehouse"
    cpu_run(root, "gemm_bf16", "gemm_small", "lin-1", generations=3, population=5, seed=1)
    from warehouse import Warehouse
    return Warehouse(root)


def test_the_deepest_kernel_is_traced_to_the_seed(warehouse_run):
    rows = warehouse_run.query("select attempt_id, lineage, tactic from attempts where outcome = 'checked' "
                               "order by len(lineage) desc, generation desc limit 1").to_pylist()
    deepest = rows[0]
    assert len(deepest["lineage"]) >= 2, rows          # a child of a child, so the walk goes through a parent
    r = runner.invoke(app, ["lineage", deepest["attempt_id"], "--format", "json", "--ir"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    steps = out["steps"]
    assert steps[0]["tactic"] == "seed" and steps[-1]["attempt_id"] == deepest["attempt_id"]
    assert [s["tactic"] for s in steps[1:]] == list(deepest["lineage"])     # the recorded lineage, step by step
    assert [s["generation"] for s in steps] == sorted(s["generation"] for s in steps)
    for prev, s in zip(steps, steps[1:]):
        if s["speedup"] is not None:
            assert s["speedup"] == pytest.approx(prev["score_ms"] / s["score_ms"])
    assert "kernel" in out["ir_text"]
    table = runner.invoke(app, ["lineage", deepest["attempt_id"]])
    assert table.exit_code == 0 and f"{len(steps)} steps" in table.output and "seed" in table.output


def test_an_unknown_attempt_and_a_missing_warehouse_are_one_line(clean_cake_env):
    r = runner.invoke(app, ["lineage", "nope"])
    assert r.exit_code != 0 and "no warehouse at" in r.output and "Traceback" not in r.output
    cpu_run(clean_cake_env / "home" / "warehouse", "gemm_bf16", "gemm_small", "lin-2", generations=1,
            population=2, seed=0)
    r = runner.invoke(app, ["lineage", "nope"])
    assert r.exit_code != 0 and "no attempt 'nope'" in r.output and "Traceback" not in r.output
