"""Append/query round trips, validation, versioning, corruption and error messages."""

import json
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wh_fixtures import attempt, dataset, measurement

from warehouse.schema import load_schema
from warehouse import TABLES, BatchRejected, Warehouse, WarehouseError
from warehouse.schema import load_schema

CURRENT = load_schema().version


def _norm(v):
    return round(v, 9) if isinstance(v, float) else v


@pytest.mark.parametrize("table", TABLES)
def test_round_trip_every_table(wh, table):
    rows = dataset()[table]
    assert wh.append(table, rows) == len(rows)
    got = wh.query(f"select * from {table}").to_pylist()
    assert len(got) == len(rows)
    key = lambda r: json.dumps({k: r[k] for k in rows[0]}, default=str, sort_keys=True)  # noqa: E731
    for want, have in zip(sorted(rows, key=key), sorted(got, key=key)):
        for col, value in want.items():
            assert _norm(have[col]) == _norm(value), (table, col)


def test_arrow_input_missing_nullable_and_defaults(wh):
    t = pa.table({"attempt_id": ["x"], "rule": ["r"], "severity": ["hint"], "message": ["m"]})
    assert wh.append("diagnostics", t) == 1
    row = wh.query("select * from diagnostics").to_pylist()[0]
    assert row["line"] is None and row["witness"] is None
    m = measurement("a", "r", "M=1", 1.0)
    del m["timer"], m["measured_at"]
    wh.append("measurements", [m])
    row = wh.query("select timer, measured_at from measurements").to_pylist()[0]
    assert row["timer"] == "cuda_event" and row["measured_at"] is not None


def test_empty_tables_are_typed(wh):
    t = wh.query("select * from measurements")
    assert t.num_rows == 0 and t.schema.field("median_ms").type == pa.float64()
    assert wh.query("select count(*) as n from failure_clusters").to_pylist() == [{"n": 0}]


def test_unknown_table_and_column_are_named(wh):
    with pytest.raises(WarehouseError, match="unknown table 'atempts'"):
        wh.append("atempts", [attempt(0)])
    with pytest.raises(WarehouseError, match="unknown column.*'colour'"):
        wh.append("attempts", [attempt(0) | {"colour": "red"}])
    a = attempt(0)
    del a["ir_hash"]
    with pytest.raises(WarehouseError, match="needs column 'ir_hash'"):
        wh.append("attempts", [a])
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("bad, expectation", [
    (dict(p10_ms=2.0, median_ms=1.0, p90_ms=3.0), "expect_column_pair_values_a_to_be_greater_than_b(median_ms,p10_ms)"),
    (dict(median_ms=math.nan), "expect_column_values_to_not_be_null(median_ms)"),
    (dict(l2="lukewarm"), "expect_column_values_to_be_in_set(l2)"),
    (dict(runs=0), "expect_column_values_to_be_between(runs)"),
])
def test_bad_measurement_is_quarantined(wh, bad, expectation):
    rows = [measurement("a1", "r", "M=1", 1.0), measurement("a2", "r", "M=1", 1.0) | bad]
    with pytest.raises(BatchRejected) as info:
        wh.append("measurements", rows)
    assert expectation in str(info.value)
    assert info.value.parquet_path.parent == wh.root / "quarantine" / "measurements"
    assert pq.read_table(info.value.parquet_path).num_rows == 2  # kept whole, not dropped
    report = json.loads(info.value.report_path.read_text())
    assert report["failed"] and report["report"]["success"] is False
    assert wh.query("select count(*) n from measurements").to_pylist() == [{"n": 0}]
    assert os.listdir(wh.root / "landing" / "measurements") == ["_compactions"]


def test_unknown_outcome_is_rejected(wh):
    with pytest.raises(BatchRejected, match=r"be_in_set\(outcome\).*'exploded'"):
        wh.append("attempts", [attempt(0, outcome="exploded")])


def test_newer_schema_version_refused_without_writing(tmp_path):
    root = tmp_path / "wh"
    Warehouse(root)
    (root / "SCHEMA_VERSION").write_text("99\n")
    before = sorted(p for p in root.rglob("*"))
    with pytest.raises(WarehouseError, match=rf"schema version 99 .* up to version {CURRENT}; upgrade Cake"):
        Warehouse(root)
    assert sorted(p for p in root.rglob("*")) == before


def test_version_bumped_while_open_blocks_append(wh):
    (wh.root / "SCHEMA_VERSION").write_text(f"{CURRENT + 1}\n")
    with pytest.raises(WarehouseError, match=f"schema version {CURRENT + 1}"):
        wh.append("attempts", [attempt(0)])
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 0}]


def test_corrupted_batch_is_named(wh):
    wh.append("attempts", [attempt(0)])
    wh.append("attempts", [attempt(1)])
    victim = sorted((wh.root / "landing" / "attempts").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:40])  # truncated, as after a disk fault
    with pytest.raises(WarehouseError) as info:
        wh.query("select count(*) from attempts")
    assert str(victim) in str(info.value) and "quarantine" in str(info.value)
    assert [p for p, _ in wh.check()] == [victim]
    # skipping keeps the rest readable; quarantining fixes it for everyone
    with pytest.warns(UserWarning, match=victim.name):
        assert Warehouse(wh.root, skip_corrupt=True).query("select count(*) n from attempts").to_pylist() == [{"n": 1}]
    moved = wh.quarantine_file(victim)
    assert moved.exists() and moved.with_suffix(".json").exists()
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 1}]


def test_malformed_query_lists_tables_and_views(wh):
    with pytest.raises(WarehouseError) as info:
        wh.query("select nope from attempts")
    msg = str(info.value)
    assert "nope" in msg and "Tables: attempts" in msg and "failure_clusters" in msg
    with pytest.raises(WarehouseError, match="(?s)Parser Error.*Tables:"):
        wh.query("selec 1")


def test_query_is_read_only_and_takes_params(wh):
    wh.append("attempts", [attempt(i) for i in range(5)])
    with pytest.raises(WarehouseError, match="read-only"):
        wh.query("copy attempts to '/tmp/x.csv'")
    t = wh.query("select count(*) n from attempts where generation = ? and attempt_id <> ?", [0, "run-a-att-0"])
    assert t.to_pylist() == [{"n": 4}]


def test_tables_lists_tables_then_views(wh):
    names = wh.tables()
    assert names[: len(TABLES)] == list(TABLES)
    assert {"runs_latest", "failures", "failure_clusters", "failure_history", "leaderboard", "convergence",
            "cost_model_error", "rule_hits", "proposals_latest"} <= set(names)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export(wh, tmp_path, fmt):
    wh.append("attempts", [attempt(i) for i in range(3)])
    out = tmp_path / f"a.{fmt}"
    assert wh.export("select attempt_id, parents from attempts order by 1", out, fmt) == 3
    if fmt == "json":
        assert [r["attempt_id"] for r in json.loads(out.read_text())] == ["run-a-att-0", "run-a-att-1", "run-a-att-2"]
    elif fmt == "parquet":
        assert pq.read_table(out).num_rows == 3
    else:
        assert out.read_text().splitlines()[0] == "attempt_id,parents"


def test_stale_temp_file_is_ignored_and_cleaned(wh):
    wh.append("attempts", [attempt(0)])
    d = wh.root / "landing" / "attempts"
    tmp = d / ".20260101T000000000000Z-999999999-abc.parquet.tmp"
    tmp.write_bytes(b"PAR1 half written")
    os.utime(tmp, (0, 0))
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 1}]
    Warehouse(wh.root)
    assert not tmp.exists()


def test_an_additive_migration_upgrades_and_keeps_old_batches(tmp_path, monkeypatch):
    import shutil
    from datetime import datetime

    from warehouse import schema as schema_mod
    old = Warehouse(tmp_path / "wh")
    row = {"run_id": "r1", "problem": "gemm_bf16", "shape_set": "gemm_small", "harness_version": 0,
           "agent": "tactic", "seed": 0, "generations": 1, "population": 1, "host": "h",
           "started_at": datetime(2026, 11, 29), "status": "running"}
    old.append("runs", [row])
    sql = tmp_path / "schema"
    shutil.copytree(schema_mod.SCHEMA_DIR, sql)
    nxt = CURRENT + 1
    (sql / f"{nxt:03d}_run_notes.sql").write_text("alter table runs add column note VARCHAR;\n")
    monkeypatch.setattr(schema_mod, "SCHEMA_DIR", sql)
    schema_mod.load_schema.cache_clear()
    try:
        new = Warehouse(tmp_path / "wh")
        assert (tmp_path / "wh" / "SCHEMA_VERSION").read_text().strip() == str(nxt)
        new.append("runs", [{**row, "run_id": "r2", "note": "after the migration"}])
        got = new.query("select run_id, note from runs order by run_id").to_pylist()
        assert got == [{"run_id": "r1", "note": None}, {"run_id": "r2", "note": "after the migration"}]
    finally:
        monkeypatch.undo()
        schema_mod.load_schema.cache_clear()
    with pytest.raises(WarehouseError, match=f"schema version {nxt} but this code knows only up to version {CURRENT}"):
        Warehouse(tmp_path / "wh")


def test_many_writers_opening_a_new_warehouse_at_once_all_succeed(tmp_path):
    # each writes SCHEMA_VERSION through a temporary file of its own (a shared one was renamed away under one)
    import threading

    from warehouse import Warehouse
    for i in range(10):
        root, errors = tmp_path / f"w{i}", []

        def open_it():
            try:
                Warehouse(root)
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and (root / "SCHEMA_VERSION").read_text().strip()


def test_a_thread_reuses_its_reader_only_while_the_batch_files_stay_as_they_were(wh):
    import threading

    wh.append("attempts", [attempt(0)])
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 1}]
    (_, con), = wh._readers.values()
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 1}]
    assert next(iter(wh._readers.values()))[1] is con                 # nothing landed: the same views
    wh.append("attempts", [attempt(1)])
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 2}]    # a new batch: new views
    assert next(iter(wh._readers.values()))[1] is not con
    seen = {}
    other = threading.Thread(target=lambda: seen.setdefault("n", wh.query("select count(*) n from attempts")))
    other.start()
    other.join()
    assert seen["n"].to_pylist() == [{"n": 2}] and len(wh._readers) == 2    # each thread its own connection
    wh.append("attempts", [attempt(2)])
    assert wh.query("select count(*) n from attempts").to_pylist() == [{"n": 3}]
    assert list(wh._readers) == [threading.get_ident()]               # the ended thread's one is closed
    # a batch damaged in place after it was read is named as before, not answered from the old views
    victim = sorted((wh.root / "landing" / "attempts").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    with pytest.raises(WarehouseError) as info:
        wh.query("select count(*) from attempts")
    assert str(victim) in str(info.value) and "quarantine" in str(info.value)
    with pytest.raises(WarehouseError, match="(?s)Parser Error.*Tables:"):
        wh.query("selec 1")                                           # a failed statement drops the reader
    assert wh._readers == {}


def test_the_validator_warmed_up_in_the_background_is_the_one_validate_uses(monkeypatch):
    import pyarrow as pa

    from warehouse import expectations

    monkeypatch.setattr(expectations, "_validator", None)
    thread = expectations.warm_up()
    thread.join(120)
    built = expectations._validator
    assert built is not None and not thread.is_alive()
    bad = pa.table({"run_id": ["r"], "status": ["no-such-status"]})
    ok, failed, _ = expectations.validate("runs", bad)
    assert expectations._validator is built
    assert not ok and any("status" in f for f in failed)
