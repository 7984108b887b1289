"""`cake sql` on a real warehouse: the filed escapes are one line each, exit 2, and change nothing."""
from __future__ import annotations

import hashlib

import pytest
from typer.testing import CliRunner

from cake_cli.main import app

runner = CliRunner()


def _attempt(i: int) -> dict:
    return dict(attempt_id=f"a{i}", run_id="r", generation=0, problem="gemm_bf16", ir_hash=f"h{i}",
                ir_text="k", agent="tactic", harness_version=0, stage="verify", outcome="verify_failed")


@pytest.fixture
def home(tmp_path):
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "home" / "warehouse")
    wh.append("attempts", [_attempt(i) for i in range(12)])
    wh.append("attempts", [_attempt(i) for i in range(12, 24)])
    return wh


def _digest(root):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("query, said", [
    ("explain analyze copy (select * from attempts limit 22) to '{batch}' (format parquet)",
     "EXPLAIN COPY statements are refused"),
    ("select * from read_csv('/etc/passwd')", "reads only its own batch files"),
    ("attach '{tmp}/x.duckdb'", "ATTACH statements are refused"),
    ("install httpfs", "INSTALL/LOAD statements are refused"),
    ("pragma version", "PRAGMA statements are refused"),
    ("set threads = 1", "SET statements are refused"),
])
def test_escape_is_one_line_exit_2_and_changes_nothing(home, tmp_path, query, said):
    batch = sorted((home.root / "landing" / "attempts").glob("*.parquet"))[0]
    before = _digest(home.root)
    result = runner.invoke(app, ["sql", query.format(batch=batch, tmp=tmp_path)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], result.stderr
    assert "root:" not in result.output
    assert _digest(home.root) == before
    ok = runner.invoke(app, ["sql", "select count(*) as n from attempts", "--format", "csv"])
    assert ok.exit_code == 0 and ok.stdout.splitlines() == ["n", "24"]
