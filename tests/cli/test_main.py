"""The `cake` CLI: help, one-line errors, `cake sql`, problems, harness and check commands, and output people read,
with stand-ins for the warehouse and the services (tests/cli/stand_ins.py)."""
from __future__ import annotations

import contextlib
import getpass
import json
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cake_cli.harness_cli as harness_cli
from cake_cli.services import ServiceError
from cake_core.outcome import Diagnostic, Severity
from cli_run import one_error_line, run
from stand_ins import fake_module, no_services, warehouse  # noqa: F401 - fixtures


# ---------------------------------------------------------------- --help


@pytest.mark.parametrize("argv", [[], ["evolve"], ["sql"], ["problems"], ["check"], ["harness"],
                                  ["harness", "proposals"], ["harness", "approve"],
                                  ["harness", "reject"], ["harness", "versions"]])
def test_help_everywhere(argv):
    result = run(*argv, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage: cake" in result.output


def test_no_args_shows_help():
    for argv in ([], ["harness"], ["evolve"], ["sql"]):
        result = run(*argv)
        assert "Usage: cake" in result.output
        assert result.exit_code in (0, 2)


# ---------------------------------------------------------------- errors


def test_unknown_problem_is_one_line_before_any_service(monkeypatch, no_services):
    from cake_core.problems import UnknownProblem

    def get_problem(name):
        raise UnknownProblem(f"unknown problem `{name}`; known: gemm_bf16 (`cake problems` lists them)")

    monkeypatch.setattr("cake_core.problems.get_problem", get_problem)
    result = run("evolve", "nope")
    assert result.exit_code == 2
    assert one_error_line(result) == ("error: unknown problem `nope`; known: gemm_bf16 "
                                      "(`cake problems` lists them)")
    assert no_services == []


def test_keep_and_no_filter_together_are_one_line_before_any_service(no_services):
    result = run("evolve", "gemm_bf16", "--no-filter", "--keep", "3")
    assert result.exit_code == 2
    assert "give one or the other" in one_error_line(result) and no_services == []
    assert run("evolve", "gemm_bf16", "--keep", "0").exit_code == 2       # typer: at least 1


def test_bad_config_is_one_line_naming_the_setting(monkeypatch, warehouse):
    monkeypatch.setenv("CAKE_PREFECT_PORT", "http")
    result = run("sql", "select 1")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "prefect_port" in line and "CAKE_PREFECT_PORT" in line and "'http'" in line


def test_bad_config_file_key(tmp_path):
    (tmp_path / "cake.toml").write_text("colour = 'blue'\n")
    result = run("problems")
    assert result.exit_code == 2
    assert "unknown setting(s) colour" in one_error_line(result)


def test_sql_error_is_one_line(warehouse):
    result = run("sql", "select * from nope")
    assert result.exit_code == 1
    assert one_error_line(result).startswith("error: Catalog Error: Table with name nope")


def test_sql_without_warehouse_says_what_to_do():
    result = run("sql", "select 1")
    assert result.exit_code == 2
    assert "no warehouse at" in one_error_line(result) and "cake evolve" in result.stderr


def test_service_error_is_one_line_exit_1(monkeypatch, warehouse):
    @contextlib.contextmanager
    def broken(settings):
        raise ServiceError("port 4200 is in use by another program; stop it or set CAKE_PREFECT_PORT=4201")
        yield

    monkeypatch.setattr(harness_cli, "prefect_server", broken)
    fake_module(monkeypatch, "flows.harness", decide_proposal=lambda *a, **k: None)
    result = run("harness", "approve", "p1", "--reason", "faster kernels")
    assert result.exit_code == 1
    assert one_error_line(result) == ("error: port 4200 is in use by another program; stop it or "
                                      "set CAKE_PREFECT_PORT=4201")


def test_internal_error_is_one_line_and_logs_the_traceback(monkeypatch, tmp_path):
    def catalogue():
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("cake_core.problems.catalogue", catalogue)
    result = run("problems")
    assert result.exit_code == 1
    log = tmp_path / "home" / "logs" / "cli.log"
    assert one_error_line(result) == (f"error: internal: RuntimeError: boom second line "
                                      f"(full traceback in {log})")
    assert "Traceback" in log.read_text() and "catalogue" in log.read_text()


def test_a_flow_run_cancelled_under_a_command_says_stopped_and_how_to_go_on(monkeypatch):
    """A SIGINT from `timeout` cancels the flow a long command runs; Prefect raises CancelledRun out of it: that is a
    stop, not an internal error (exit 130, nothing logged as a crash)."""
    from prefect.exceptions import CancelledRun

    def catalogue():
        raise CancelledRun("run kmeans_assign-frozen-s1 was stopped")

    monkeypatch.setattr("cake_core.problems.catalogue", catalogue)
    result = run("problems")
    assert result.exit_code == 130
    assert one_error_line(result) == ("error: stopped: run kmeans_assign-frozen-s1 was stopped; what was recorded is "
                                      "kept: run the same command again to go on")


# ---------------------------------------------------------------- sql


@pytest.fixture
def counts(warehouse):
    table = pa.table({"outcome": ["measured", "verify_failed", "x" * 200],
                      "n": [3, 5, None], "ms": [0.1234567, None, 2.0]})
    warehouse.tables["attempts"] = table
    return table


def test_sql_table_truncates_long_cells(counts):
    result = run("sql", "select outcome, count(*) from attempts group by all")
    assert result.exit_code == 0, result.output
    assert "verify_failed" in result.stdout and "0.123457" in result.stdout
    assert "x" * 200 not in result.stdout and "…" in result.stdout


def test_sql_exports(counts, tmp_path):
    result = run("sql", "select * from attempts", "--format", "csv")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:2] == ["outcome,n,ms", "measured,3,0.1234567"]

    result = run("sql", "select * from attempts", "--format", "json")
    assert json.loads(result.stdout)[1] == {"outcome": "verify_failed", "n": 5, "ms": None}

    out = tmp_path / "a.parquet"
    result = run("sql", "select * from attempts", "--format", "parquet", "--out", str(out))
    assert result.exit_code == 0 and "wrote 3 rows" in result.stderr
    assert pq.read_table(out).equals(counts)

    result = run("sql", "select * from attempts", "--format", "parquet")
    assert result.exit_code == 2 and "--out" in one_error_line(result)

    out = tmp_path / "a.csv"
    assert run("sql", "select * from attempts", "-f", "csv", "-o", str(out)).exit_code == 0
    assert out.read_text().startswith("outcome,n,ms\n")


# ---------------------------------------------------------------- problems, harness, check


def test_problems_table(monkeypatch):
    from cake_core.problems import Broken
    p = types.SimpleNamespace(name="gemm_bf16", description="C[m, n] = A @ B in bf16; the rest is detail",
                              shape_sets=["llm_decode", "square"], source="built-in", root=None)
    q = types.SimpleNamespace(name="mine", description="a plugin", shape_sets=["s"], source="path /x/mine", root=None)
    broken = Broken("path /x", "/x/bad/__init__.py:3", "NameError: name 'oracle' is not defined")
    monkeypatch.setattr("cake_core.problems.catalogue",
                        lambda: types.SimpleNamespace(problems={"gemm_bf16": p, "mine": q}, broken=[broken]))
    result = run("problems")
    assert result.exit_code == 0
    out = " ".join(result.stdout.split())
    assert "gemm_bf16" in out and "llm_decode, square" in out and "C[m, n] = A @ B in bf16" in out
    assert "the rest is detail" not in out and "path /x/mine" in out
    assert "broken problem: /x/bad/__init__.py:3: NameError: name 'oracle' is not defined (path /x)" in \
        " ".join(result.stderr.split())


def test_harness_approve_and_reject_call_decide_proposal(monkeypatch, tmp_path, no_services):
    calls = []

    def decide_proposal(proposal_id, approve, reason, decided_by, warehouse_root):
        calls.append((proposal_id, approve, reason, decided_by, warehouse_root))
        return 3 if approve else "resumed review flow run 1234"

    fake_module(monkeypatch, "flows.harness", decide_proposal=decide_proposal)
    result = run("harness", "approve", "prop-7", "--reason", "catches 12 failures")
    assert result.exit_code == 0, result.output
    assert "approved proposal prop-7: harness version 3 created" in result.stdout
    root = str(tmp_path / "home" / "warehouse")
    assert calls == [("prop-7", True, "catches 12 failures", getpass.getuser(), root)]
    assert no_services == ["prefect"]

    result = run("harness", "reject", "prop-8", "--reason", "breaks the gemm corpus")
    assert result.exit_code == 0 and "rejected proposal prop-8: resumed" in result.stdout
    assert calls[1] == ("prop-8", False, "breaks the gemm corpus", getpass.getuser(), root)

    result = run("harness", "reject", "prop-9")      # the reason is required
    assert result.exit_code == 2 and len(calls) == 2


def test_harness_review_runs_under_a_named_policy_and_refuses_an_unknown_one(monkeypatch, warehouse, no_services):
    calls = []

    def harness_review_flow(**kw):
        calls.append(kw)
        return [{"proposal_id": "p1", "kind": "rule", "decision": "approved", "new_version": 2}]

    fake_module(monkeypatch, "flows.harness", harness_review_flow=harness_review_flow,
                POLICIES=("manual", "approve-gated", "record-only"))
    monkeypatch.setenv("CAKE_GPU", "off")
    result = run("harness", "review", "--policy", "approve-gated")
    assert result.exit_code == 0, result.output
    assert "proposal p1: approved, harness version 2" in result.stdout
    assert calls[0]["policy"] == "approve-gated" and calls[0]["gpu_cache_dir"] is None
    result = run("harness", "review", "--policy", "yolo")
    assert one_error_line(result) == "error: --policy must be one of manual, approve-gated, record-only, not `yolo`"
    assert len(calls) == 1


def test_harness_lists(warehouse):
    warehouse.tables["proposals_latest"] = pa.table({"proposal_id": ["p1"], "status": ["pending"]})
    warehouse.tables["harness_versions"] = pa.table({"version": [0, 1]})
    result = run("harness", "proposals")
    assert result.exit_code == 0 and "pending" in result.stdout
    result = run("harness", "versions")
    assert result.exit_code == 0 and "version" in result.stdout


def test_check_prints_diagnostics_and_fails_on_errors(monkeypatch, tmp_path):
    src = tmp_path / "k.cake"
    src.write_text("kernel k {\n  smem a: f32[99999999]\n}\n")
    diags = [Diagnostic("resources.smem", Severity.ERROR, "smem exceeds 227 KiB", line=2, col=3,
                        hint="use a smaller tile"),
             Diagnostic("perf.tile", Severity.HINT, "tile is small", line=1, col=1)]
    seen = {}

    def check_file(path, target=None):
        seen["args"] = (path, target)
        return diags

    monkeypatch.setattr("cake_core.ir.check.check_file", check_file)
    result = run("check", str(src), "--target", "sm_100a")
    assert result.exit_code == 1 and result.stderr == ""
    assert seen["args"] == (str(src), "sm_100a")
    assert f"{src}:2:3: error[resources.smem]: smem exceeds 227 KiB" in result.stdout
    assert "    ^" in result.stdout and "1 error(s), 1 other" in result.stdout

    result = run("check", str(src), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["errors"] == 1 and doc["diagnostics"][0]["rule"] == "resources.smem"

    monkeypatch.setattr("cake_core.ir.check.check_file", lambda path, target=None: diags[1:])
    result = run("check", str(src))
    assert result.exit_code == 0


def test_check_missing_file_is_usage_error(tmp_path):
    result = run("check", str(tmp_path / "none.cake"))
    assert result.exit_code == 2 and "no such file" in one_error_line(result)


def test_check_and_run_on_a_directory_say_so(tmp_path):
    for argv in (["check", str(tmp_path)], ["run", str(tmp_path), "--problem", "tinygemm", "--shape", "M=1,N=1,K=1"]):
        result = run(*argv)
        assert result.exit_code == 2 and "is a directory" in one_error_line(result), argv


def test_sql_out_that_cannot_be_written_is_a_usage_error(counts, tmp_path):
    for out in (tmp_path / "no" / "such" / "x.csv", tmp_path):
        result = run("sql", "select * from attempts", "-f", "csv", "-o", str(out))
        line = one_error_line(result)
        assert result.exit_code == 2 and "internal" not in line and str(out) in line, line


# ---------------------------------------------------------------- output people read and type from


def test_proposals_piped_keep_the_id_a_person_types(warehouse):
    pid = "prop-rule-tail-guard-0123456789abcdef0123456789"
    warehouse.tables["proposals_latest"] = pa.table({
        "proposal_id": [pid], "kind": ["rule"], "status": ["pending"],
        "title": ["reject unguarded loads on a dimension that is not a tile multiple (gemm_bf16)"],
        "created_at": ["2026-11-29 12:00:00"]})
    result = run("harness", "proposals")        # CliRunner output is a pipe: 80 columns
    assert result.exit_code == 0, result.output
    assert pid in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    assert "cake harness approve ID --reason" in result.stdout
    assert "evidence" not in warehouse.queries[0][0].split("from")[0]   # the JSON stays out of the list


def test_sql_table_piped_is_readable_at_80_columns(warehouse):
    warehouse.tables["attempts"] = pa.table({c: [f"{c}-value-{i}" for i in range(3)] for c in
                                             ["attempt_id", "run_id", "problem", "outcome", "stage", "tactic",
                                              "error_rule", "signature"]})
    result = run("sql", "select * from attempts")
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "attempt_id-value-2" in result.stdout and "signature" in result.stdout and "…" not in result.stdout


def test_run_prints_diagnostics_as_check_does(tmp_path):
    src = tmp_path / "bad.cake"
    src.write_text('@kernel(target="sm_90a", grid=(1,), threads=128)\n'
                   'def k(a: gmem[bf16, (N,)], b: gmem[bf16, (N,)]):\n'
                   '    lod(a)\n    stor(b)\n')
    result = run("run", str(src), "--problem", "tinygemm", "--shape", "M=1,N=64,K=64")
    assert result.exit_code == 1
    checked = run("check", str(src))
    lines = result.stdout.splitlines()
    for line in checked.stdout.splitlines()[:-1]:       # every diagnostic block, line for line
        assert line in lines
    assert f"{src}:3:5: error[parse.unknown_op]" in result.stdout
    assert all(line.count("error[") <= 1 for line in lines) and sum("error[" in ln for ln in lines) >= 2
    assert "not run: fix the errors above" in result.stdout
    assert result.stderr == ""
