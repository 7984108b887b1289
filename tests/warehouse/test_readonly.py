"""`Warehouse.query` cannot write, copy, attach, install, load, change settings or read other files.

Each known escape is tried against a warehouse whose batch files are hashed
before and after: a refusal must leave every byte as it was.
"""

import hashlib
import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wh_fixtures import attempt

from warehouse import ReadOnlyError, Warehouse, WarehouseError
from warehouse.readonly import locked_connection, read_only_statements


def _digest(root):
    return {p.relative_to(root): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made24(tmp_path_factory):
    """24 attempts in two batches, the numbers of the filed report: appended once a module."""
    wh = Warehouse(tmp_path_factory.mktemp("wh24") / "wh")
    wh.append("attempts", [attempt(i) for i in range(12)])
    wh.append("attempts", [attempt(i) for i in range(12, 24)])
    return wh.root


@pytest.fixture
def wh24(made24, tmp_path):
    """A copy of ``made24`` of the test's own, byte for byte the same batch files."""
    shutil.copytree(made24, tmp_path / "wh")
    return Warehouse(tmp_path / "wh")


def _batch(wh):
    return sorted((wh.root / "landing" / "attempts").glob("*.parquet"))[0]


def _count(wh):
    return wh.query("select count(*) n from attempts").to_pylist()[0]["n"]


def _refused(wh, sql, *words):
    before = _digest(wh.root)
    with pytest.raises(ReadOnlyError) as info:
        wh.query(sql)
    msg = str(info.value)
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg
    assert _digest(wh.root) == before, f"{sql!r} changed the warehouse"
    assert _count(wh) == 24
    return msg


@pytest.mark.parametrize("template", [
    "explain analyze copy (select * from attempts limit 22) to '{batch}' (format parquet)",
    "explain analyze copy (select * from attempts limit 22) to '{batch}' (format parquet, use_tmp_file false)",
    "EXPLAIN ANALYSE COPY (SELECT 1) TO '{batch}'",
    "explain (analyze, format json) copy (select 1 as x) to '{batch}' (format parquet)",
    "explain (format json) copy (select 1 as x) to '{batch}'",
    "/* a comment */ explain -- another\n analyze copy (select 1) to '{batch}'",
    "copy (select * from attempts limit 22) to '{batch}' (format parquet, use_tmp_file false)",
    "copy attempts to '{batch}' (format parquet)",
    "select 1; copy (select 1) to '{batch}'",
])
def test_copy_onto_a_batch_is_refused_and_changes_nothing(wh24, template):
    batch = _batch(wh24)
    msg = _refused(wh24, template.format(batch=batch), "read-only", "COPY", "--out FILE")
    assert "EXPLAIN" in msg or not template.lower().lstrip().startswith(("explain", "/*"))


def test_copy_elsewhere_is_refused_and_writes_nothing(wh24, tmp_path):
    out = tmp_path / "leak.csv"
    _refused(wh24, f"copy (select * from attempts) to '{out}'", "COPY")
    _refused(wh24, f"explain analyze copy (select * from attempts) to '{out}'", "EXPLAIN COPY")
    assert not out.exists()


@pytest.mark.parametrize("sql, kind", [
    ("attach '{tmp}/x.duckdb' as x", "ATTACH"),
    ("attach ':memory:' as m", "ATTACH"),
    ("detach m", "DETACH"),
    ("install httpfs", "INSTALL/LOAD"),
    ("load httpfs", "INSTALL/LOAD"),
    ("force install json", "INSTALL/LOAD"),
    ("pragma version", "PRAGMA"),
    ("pragma enable_profiling", "PRAGMA"),
    ("pragma threads = 1", "SET"),          # DuckDB parses a PRAGMA with a value as SET
    ("set enable_external_access = true", "SET"),
    ("set threads = 1", "SET"),
    ("reset lock_configuration", "SET"),
    ("set variable v = 1", "SET"),
    ("call checkpoint()", "CALL"),
    ("create table t as select * from attempts", "CREATE"),
    ("create view v as select 1", "CREATE"),
    ("create macro m() as 1", "CREATE"),
    ("insert into attempts select * from attempts", "INSERT"),
    ("delete from attempts", "DELETE"),
    ("update attempts set outcome = 'x'", "UPDATE"),
    ("drop view attempts", "DROP"),
    ("export database '{tmp}/dump'", "EXPORT"),
    ("begin transaction", "TRANSACTION"),
    ("prepare p as select 1", "PREPARE"),
    ("explain analyze create table t as select 1", "EXPLAIN CREATE"),
    ("explain analyze insert into attempts select * from attempts", "EXPLAIN INSERT"),
    ("explain analyze pragma version", "EXPLAIN PRAGMA"),
    ("explain set threads = 1", "EXPLAIN SET"),
])
def test_statement_kinds_that_are_not_reads_are_refused(wh24, tmp_path, sql, kind):
    _refused(wh24, sql.format(tmp=tmp_path), "read-only", kind)
    assert not (tmp_path / "x.duckdb").exists() and not (tmp_path / "dump").exists()


@pytest.fixture
def outside(tmp_path):
    """A well-formed Parquet file and a CSV file that are not the warehouse's."""
    pq.write_table(pa.table({"secret": ["s3cr3t"]}), tmp_path / "other.parquet")
    (tmp_path / "other.csv").write_text("secret\ns3cr3t\n")
    return tmp_path


@pytest.mark.parametrize("sql", [
    "select * from read_csv('/etc/passwd')",
    "select * from read_csv_auto('/etc/passwd')",
    "select * from read_text('/etc/passwd')",
    "select * from read_blob('/etc/hostname')",
    "select * from read_json('/etc/hostname')",
    "select * from sniff_csv('/etc/passwd')",
    "select * from glob('/etc/*')",
    "select * from read_parquet('{out}/other.parquet')",
    "select * from parquet_metadata('{out}/other.parquet')",
    "select * from '{out}/other.parquet'",
    "select * from '{out}/other.csv'",
    "select * from read_csv('{out}/other.csv')",
    "select * from read_parquet('{root}/landing/attempts/*.parquet')",
    "select * from read_parquet('{root}/../other.parquet')",
    "select * from read_csv('https://example.com/x.csv')",
    "with t as (select 1) select * from t, read_text('/etc/passwd')",
    "explain analyze select * from read_text('/etc/passwd')",
])
def test_file_readers_on_other_paths_are_refused(wh24, outside, sql):
    msg = _refused(wh24, sql.format(out=outside, root=wh24.root), "reads only its own batch files")
    assert "s3cr3t" not in msg and "root:" not in msg


def test_replacement_scans_see_no_python_variables(wh24):
    secret_table = pa.table({"secret": ["s3cr3t"]})  # noqa: F841 - what a replacement scan would find
    with pytest.raises(WarehouseError, match="secret_table"):
        wh24.query("select * from secret_table")


def test_the_connection_itself_refuses_even_without_the_statement_check(wh24, outside):
    """The second barrier: a statement that got past the classifier still fails inside DuckDB."""
    con, _ = wh24._connect()
    try:
        for sql in ["set enable_external_access = true", "set allowed_paths = ['/etc/passwd']",
                    "reset lock_configuration", "set lock_configuration = false",
                    "set python_enable_replacements = true", "pragma threads = 1",
                    f"attach '{outside}/x.duckdb' as x", "install httpfs", "load httpfs",
                    "select * from read_text('/etc/passwd')",
                    f"select * from read_parquet('{outside}/other.parquet')",
                    f"copy (select 1) to '{outside}/leak.csv'"]:
            with pytest.raises(duckdb.Error):
                con.execute(sql)
        assert con.execute("select current_setting('enable_external_access'), "
                           "current_setting('lock_configuration')").fetchall() == [(False, True)]
        assert con.execute("select count(*) from attempts").fetchall() == [(24,)]
    finally:
        con.close()
    assert not (outside / "x.duckdb").exists() and not (outside / "leak.csv").exists()


def test_locked_connection_reads_only_its_files(outside):
    con = locked_connection([outside / "other.parquet"])
    try:
        assert con.execute(f"select * from read_parquet('{outside}/other.parquet')").fetchall() == [("s3cr3t",)]
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"select * from read_csv('{outside}/other.csv')")
    finally:
        con.close()


@pytest.mark.parametrize("sql", [
    "select count(*) from attempts",
    "from attempts limit 3",
    "values (1, 2)",
    "with a as (select * from attempts) select count(*) from a",
    "(select 1) union all (select 2)",
    "describe attempts",
    "show tables",
    "summarize attempts",
    "explain select * from attempts",
    "explain analyze select count(*) from attempts",
    "explain (select 1)",
    "explain analyze (select 1) union (select 2)",
    "explain (format json) select 1",
    "select 'copy x to y' as text, 'attach' as a",
    "select 1; select count(*) from attempts",
])
def test_reads_still_answer(wh24, sql):
    assert wh24.query(sql).num_rows >= 1


def test_a_batch_file_of_the_warehouse_may_be_read_directly(wh24):
    batch = _batch(wh24)
    assert wh24.query(f"select count(*) n from read_parquet('{batch}')").to_pylist() == [{"n": 12}]


def test_every_view_answers(filled):
    for view in filled.schema.views:
        filled.query(f"select * from {view}")
    assert filled.query("select count(*) n from failure_clusters").to_pylist()[0]["n"] > 0


def test_classifier_on_its_own():
    assert [s.type.name for s in read_only_statements("select 1; explain analyze select 2")] == \
        ["SELECT", "EXPLAIN"]
    with pytest.raises(ReadOnlyError, match="EXPLAIN COPY"):
        read_only_statements("explain analyze copy (select 1) to 'x.parquet'")
    with pytest.raises(WarehouseError, match="Parser Error"):
        read_only_statements("selec 1")
    with pytest.raises(WarehouseError, match="empty"):
        read_only_statements(" ;")
