"""The warehouse store: append-only Parquet batches read through in-memory DuckDB views.

The warehouse is a folder; nothing ever holds a database file open for writing,
so ``query()`` answers while any number of flows append::

    <root>/
      SCHEMA_VERSION                      schema version the data was written with ("1")
      landing/<table>/<batchid>.parquet   landed batches, immutable once visible
      landing/<table>/.<batchid>.parquet.tmp   being written (ignored; cleaned when stale)
      landing/<table>/_compactions/<batchid>.json   compaction records (see ``compact``)
      quarantine/<table>/<batchid>.parquet + .json   rejected batches + GX report / reason
      locks/compact-<table>.lock          one compactor per table at a time
      cake.duckdb                         not used: the folder is the warehouse

Writes: a batch is validated with Great Expectations, written to a temporary
name in the table folder, fsynced, renamed into place with ``os.replace`` and the
folder fsynced; ``append()`` returns only after that, so a ``kill -9`` at any
point loses nothing it acknowledged. Batch ids are ``<UTC time>-<pid>-<uuid>``,
so any number of processes may write at once.

Reads: every ``query()`` checks that its statements are read-only and lists
the batch files; for a new listing it opens a fresh in-memory DuckDB that may
read only those files and nothing else (see ``warehouse.readonly``), creates one
view per table over exactly those files (``read_parquet([...],
union_by_name=true)`` unioned by name with a typed empty relation, so empty
tables and batches from older schema versions work), then replays the schema's
views. Batch files are immutable, so a thread whose next query lists the same
files reuses that connection (a poller of an unchanged warehouse, such as the
live view of `cake evolve`, no longer builds every view twice a second).

Compaction (``compact``) is safe against concurrent readers: the merged file is
written under a temporary name, then a record listing its inputs is committed,
then the merged file is renamed into place. Readers list the batch files first
and the records second, and drop the inputs of every record whose output they
saw (the output is renamed into place only after its record is committed). Inputs are deleted only
``grace_s`` seconds after their record, by a later ``compact``.

The file operations these rules rest on (batch ids, atomic writes, the listing a reader sees, pruning,
stale temporaries) are ``warehouse.batches``'; this module is the DuckDB side and the schema's checks.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import warnings
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa

from warehouse.batches import (TMP_SUFFIX, clean_stale_tmp, corrupt_files, file_identity, fsync_dir, list_batches,
                               new_batch_id, prune_compacted, sql_str, vanished, write_parquet_atomic,
                               write_text_atomic)
from warehouse.errors import BatchRejected, WarehouseError
from warehouse.readonly import ReadOnlyError, locked_connection, outside_message, read_only_statements
from warehouse.schema import Schema, eval_default, load_schema

TABLES: tuple[str, ...] = tuple(load_schema().arrow)
EXPORT_FORMATS = ("csv", "parquet", "json")

class _Relist(Exception):
    """A batch file listed for a view vanished (pruned by a compaction): list the batches again."""


class Warehouse:
    """A warehouse folder: append validated batches, query them with DuckDB SQL.

    Parameters
    ----------
    root : str or Path
        The warehouse folder; created with its layout if missing.
    skip_corrupt : bool
        If False (default) a query over a corrupted batch file fails with a
        message naming it; if True such files are left out with a warning.

    Raises
    ------
    WarehouseError
        If the folder was written by a newer schema version than this code knows.
    """

    def __init__(self, root: str | Path, *, skip_corrupt: bool = False):
        self.root = Path(root)
        self.schema: Schema = load_schema()
        self.skip_corrupt = skip_corrupt
        self._version_file = self.root / "SCHEMA_VERSION"
        on_disk = self._check_version()  # before creating anything
        for sub in ("landing", "quarantine", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for t in TABLES:
            (self.root / "landing" / t / "_compactions").mkdir(parents=True, exist_ok=True)
        if on_disk is None or on_disk < self.schema.version:
            # Migrations are additive; old batches are read by column name.
            write_text_atomic(f"{self.schema.version}\n", self._version_file)
        self._clean_stale_tmp()
        # thread ident -> (batch files with size and time, connection over exactly them): each thread reuses
        # only its own
        self._readers: dict[int, tuple[list[tuple], duckdb.DuckDBPyConnection]] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"] = {}         # connections stay with the process (and thread) that opened them
        return state

    def __del__(self) -> None:
        for _, con in getattr(self, "_readers", {}).values():
            try:
                con.close()
            except Exception:  # noqa: BLE001 - closing at collection time: nothing to report
                pass

    # ------------------------------------------------------------------ version

    def _check_version(self) -> int | None:
        try:
            text = self._version_file.read_text().strip()
        except FileNotFoundError:
            return None
        try:
            on_disk = int(text)
        except ValueError:
            raise WarehouseError(f"{self._version_file} holds {text!r}, not a schema version number; "
                                 f"restore it (this code writes version {self.schema.version})") from None
        if on_disk > self.schema.version:
            raise WarehouseError(
                f"warehouse {self.root} has schema version {on_disk} but this code knows only up to "
                f"version {self.schema.version}; upgrade Cake (pull and `uv sync`) before reading or "
                f"writing it. Nothing was written.")
        return on_disk

    # ------------------------------------------------------------------ append

    def append(self, table: str, rows: list[dict] | pa.Table) -> int:
        """Validate a batch and land it atomically as one Parquet file.

        Parameters
        ----------
        table : str
            One of ``TABLES``.
        rows : list of dict or pyarrow.Table
            Column names must belong to the table. Missing nullable columns are
            filled with null, missing defaulted columns with their default.

        Returns
        -------
        int
            Number of rows landed (0 for an empty batch, which writes nothing).

        Raises
        ------
        WarehouseError
            Unknown table or column, missing required column, uncastable value,
            or a newer schema version on disk.
        BatchRejected
            The batch failed validation; it was written to ``quarantine/<table>/``
            with a JSON report next to it.
        """
        self._check_version()
        batch = self._to_arrow(table, rows)
        if batch.num_rows == 0:
            return 0
        from warehouse.expectations import validate  # imports great_expectations: slow, so lazily

        ok, failed, report = validate(table, batch)
        batch_id = new_batch_id()
        if not ok:
            qdir = self.root / "quarantine" / table
            qdir.mkdir(parents=True, exist_ok=True)
            parquet_path = write_parquet_atomic(batch, qdir / f"{batch_id}.parquet")
            report_path = qdir / f"{batch_id}.json"
            write_text_atomic(json.dumps({"table": table, "batch_id": batch_id, "rows": batch.num_rows,
                                           "failed": failed, "report": report}, indent=1, default=str),
                               report_path)
            raise BatchRejected(table, failed, parquet_path, report_path)
        write_parquet_atomic(batch, self.root / "landing" / table / f"{batch_id}.parquet")
        return batch.num_rows

    def _to_arrow(self, table: str, rows: list[dict] | pa.Table) -> pa.Table:
        """Conform rows to the table's Arrow schema (same column order and types)."""
        if table not in self.schema.arrow:
            raise WarehouseError(f"unknown table {table!r}; tables are: {', '.join(TABLES)}")
        schema = self.schema.arrow[table]
        columns = {c.name: c for c in self.schema.columns[table]}
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        if isinstance(rows, pa.Table):
            given = set(rows.column_names)
            n = rows.num_rows
        elif isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
            given = set().union(*(r.keys() for r in rows)) if rows else set()
            n = len(rows)
        else:
            raise WarehouseError(f"append({table!r}, ...) takes a list of dicts or a pyarrow.Table, "
                                 f"got {type(rows).__name__}")
        unknown = sorted(given - set(columns))
        if unknown:
            raise WarehouseError(f"unknown column(s) {', '.join(map(repr, unknown))} for table {table!r}; "
                                 f"its columns are: {', '.join(columns)}")
        arrays = []
        for field in schema:
            col = columns[field.name]
            try:
                if field.name in given:
                    if isinstance(rows, pa.Table):
                        arr = rows.column(field.name)
                        if pa.types.is_timestamp(arr.type) and arr.type.tz is not None:
                            arr = arr.cast(pa.timestamp(arr.type.unit))  # values are UTC already
                        arrays.append(arr.cast(field.type))
                    else:
                        default = eval_default(col) if col.default is not None else None
                        values = [r[field.name] if field.name in r else default for r in rows]
                        try:
                            arrays.append(pa.array(values, type=field.type))
                        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                            # e.g. ISO strings for timestamps: let Arrow's cast parse them
                            arrays.append(pa.array(values).cast(field.type))
                elif col.default is not None:
                    arrays.append(pa.array([eval_default(col)] * n, type=field.type))
                elif col.nullable:
                    arrays.append(pa.nulls(n, type=field.type))
                else:
                    raise WarehouseError(f"table {table!r} needs column {field.name!r} "
                                         f"({col.sql_type} NOT NULL); the batch has none")
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                    OverflowError) as e:
                raise WarehouseError(f"column {field.name!r} of table {table!r} does not convert to "
                                     f"{col.sql_type}: {e}") from None
        return pa.Table.from_arrays(arrays, schema=schema)

    # ------------------------------------------------------------------ read

    def _table_dir(self, table: str) -> Path:
        return self.root / "landing" / table

    def _snapshot(self, table: str) -> list[Path]:
        return list_batches(self._table_dir(table))

    def _empty_select(self, table: str) -> str:
        cols = ", ".join(f'cast(null as {c.sql_type}) as "{c.name}"' for c in self.schema.columns[table])
        return f"select {cols} where false"

    RELISTS = 5     # listings a reader tries while compactions prune the files it listed

    def _listing(self) -> dict[str, list[Path]]:
        return {t: [f.absolute() for f in self._snapshot(t)] for t in TABLES}

    def _reader(self) -> tuple[duckdb.DuckDBPyConnection, list[Path], bool]:
        """This thread's connection over the batch files listed now, those files, and whether the connection
        is new: the one it used last if the same files are listed, each with the same size and time (batch
        files never change once visible; one damaged in place gets a fresh connection, which names it), else
        a fresh one (see :meth:`_connect`)."""
        me = threading.get_ident()
        listing = self._listing()
        files = [f for fs in listing.values() for f in fs]
        key = file_identity(files)
        held = self._readers.get(me)
        if held is not None and held[0] == key:
            return held[1], files, False
        self._drop_reader(me)
        con, files = self._connect(listing)
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in list(self._readers) if i not in alive]:
            self._drop_reader(ident)        # a thread that has ended: its connection is closed here
        self._readers[me] = (file_identity(files), con)
        return con, files, True

    def _drop_reader(self, ident: int | None = None) -> None:
        held = self._readers.pop(threading.get_ident() if ident is None else ident, None)
        if held is not None:
            held[1].close()

    def _connect(self, listing: dict[str, list[Path]] | None = None) -> tuple[duckdb.DuckDBPyConnection, list[Path]]:
        """Fresh in-memory DuckDB, locked down to read-only, with one view per table over its batches; and
        the batch files it lists (a query that fails after one of them vanished lists again). ``listing``:
        the batch files by table, already listed."""
        for attempt in range(self.RELISTS):
            snapshot = listing if listing is not None and attempt == 0 else self._listing()
            files = [f for fs in snapshot.values() for f in fs]
            con = locked_connection(files)
            try:
                for t, fs in snapshot.items():
                    self._create_view(con, t, fs, relist_ok=attempt < self.RELISTS - 1)
                for stmt in self.schema.view_sql:
                    con.execute(stmt)
                return con, files
            except _Relist:
                con.close()  # a file pruned by a compaction since we listed: list again
            except duckdb.Error:
                con.close()
                if attempt == self.RELISTS - 1 or not vanished(files):
                    raise
            except BaseException:
                con.close()
                raise
        raise WarehouseError(f"the batch files of {self.root} kept changing while being listed; "
                             f"query again")

    def _create_view(self, con: duckdb.DuckDBPyConnection, table: str, files: list[Path],
                     relist_ok: bool) -> None:
        """The view ``table`` over ``files``; corrupt files are named (or skipped with ``skip_corrupt``)."""
        while True:
            body = self._empty_select(table)
            if files:
                lst = "[" + ", ".join(sql_str(f) for f in files) + "]"
                body += f" union all by name select * from read_parquet({lst}, union_by_name=true)"
            try:
                con.execute(f'create view "{table}" as {body}')
                return
            except duckdb.Error as e:
                bad = corrupt_files(files)
                if not bad and relist_ok:
                    raise _Relist() from None
                if not bad:
                    raise WarehouseError(f"cannot read table {table!r}: {e}") from None
                if not self.skip_corrupt:
                    raise WarehouseError(self._corrupt_message(bad)) from None
                warnings.warn(self._corrupt_message(bad), stacklevel=4)
                files = [f for f in files if f not in {p for p, _ in bad}]

    def _corrupt_message(self, bad: list[tuple[Path, str]]) -> str:
        lines = [f"  {p}: {why}" for p, why in bad]
        return ("corrupted batch file(s) in the warehouse:\n" + "\n".join(lines) +
                f"\nMove each to {self.root / 'quarantine' / '<table>'}/ (Warehouse.quarantine_file(path) "
                "does it) and query again; the other batches are intact.")

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run read-only SQL over the tables and views; returns an Arrow table.

        Several statements may be given; the last one's result is returned.

        Raises
        ------
        ReadOnlyError
            A statement that could write, attach, install, load or change a
            setting, or a read of a file outside the warehouse.
        WarehouseError
            Malformed SQL (DuckDB's message plus the tables and views), or a
            corrupted batch file.
        """
        try:
            statements = read_only_statements(sql)
        except ReadOnlyError:
            raise
        except WarehouseError as e:
            raise WarehouseError(self._sql_error(e)) from None
        for attempt in range(self.RELISTS):
            con, files, fresh = self._reader()
            if not fresh:               # a reused connection that fails answers nothing: a fresh one decides
                try:
                    return self._run(con, statements, params)
                except BaseException as e:
                    self._drop_reader()
                    if not isinstance(e, duckdb.Error):
                        raise
                con, files, fresh = self._reader()
            try:
                return self._run(con, statements, params)
            except duckdb.Error as e:
                self._drop_reader()     # a failed statement: the next query starts from a fresh connection
                # A batch file pruned by a compaction between our listing and the read (DuckDB then reports
                # a missing file, or a glob under its name outside the allowed paths): list again.
                if attempt < self.RELISTS - 1 and vanished(files):
                    continue
                if isinstance(e, duckdb.PermissionException):
                    raise ReadOnlyError(outside_message(e)) from None
                raise WarehouseError(self._sql_error(e)) from None
            except BaseException:
                self._drop_reader()
                raise
        raise AssertionError("unreachable")

    @staticmethod
    def _run(con: duckdb.DuckDBPyConnection, statements: list, params: list | None) -> pa.Table:
        for s in statements[:-1]:
            con.execute(s.query).fetchall()  # DuckDB refuses the next one while a result is open
        rel = con.sql(statements[-1].query, params=params or None)
        return rel.to_arrow_table() if rel is not None else pa.table({})

    def _sql_error(self, e: Exception) -> str:
        return (f"{e}\nTables: {', '.join(TABLES)}\nViews: {', '.join(self.schema.views)}")

    def tables(self) -> list[str]:
        """Names of the tables, then of the views."""
        return list(TABLES) + list(self.schema.views)

    def export(self, sql: str, path: str | Path, fmt: str = "parquet", params: list | None = None) -> int:
        """Write a query's result to ``path`` as csv, parquet or json (an array of objects).

        Returns the number of rows written. The file appears atomically.
        """
        if fmt not in EXPORT_FORMATS:
            raise WarehouseError(f"export format {fmt!r} unknown; use one of {', '.join(EXPORT_FORMATS)}")
        result = self.query(sql, params)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
        options = {"csv": "format csv, header true", "parquet": "format parquet",
                   "json": "format json, array true"}[fmt]
        con = duckdb.connect(":memory:")
        try:
            con.register("result", result)
            con.execute(f"copy result to {sql_str(tmp)} ({options})")
        finally:
            con.close()
        os.replace(tmp, path)
        return result.num_rows

    # ------------------------------------------------------------------ maintenance

    def check(self) -> list[tuple[Path, str]]:
        """Every landed batch file whose Parquet footer cannot be read, with the reason."""
        return corrupt_files(f for t in TABLES for f in self._snapshot(t))

    def quarantine_file(self, path: str | Path, reason: str = "corrupted") -> Path:
        """Move a landed batch file to ``quarantine/<table>/`` with a note; returns its new path."""
        path = Path(path).resolve()
        table = path.parent.name
        if path.parent != self._table_dir(table).resolve() or table not in TABLES:
            raise WarehouseError(f"{path} is not a batch file of this warehouse")
        qdir = self.root / "quarantine" / table
        qdir.mkdir(parents=True, exist_ok=True)
        dest = qdir / path.name
        os.replace(path, dest)
        write_text_atomic(json.dumps({"table": table, "file": path.name, "reason": reason,
                                       "moved_at": datetime.now(timezone.utc).isoformat()}),
                           dest.with_suffix(".json"))
        return dest

    def _clean_stale_tmp(self) -> None:
        clean_stale_tmp(d for t in TABLES for d in (self._table_dir(t), self._table_dir(t) / "_compactions",
                                                    self.root / "quarantine" / t))

    def compact(self, table: str, *, min_files: int = 2, grace_s: float = 600.0) -> int:
        """Merge a table's batch files into one; returns how many files were merged.

        Safe while others read and append (see module docstring). Inputs of
        earlier compactions are deleted once their record is ``grace_s`` old;
        a reader whose query outlives that retries once. Only one compactor per
        table runs at a time; a second call returns 0 at once.
        """
        if table not in TABLES:
            raise WarehouseError(f"unknown table {table!r}; tables are: {', '.join(TABLES)}")
        self._check_version()
        with open(self.root / "locks" / f"compact-{table}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            prune_compacted(self._table_dir(table), grace_s)
            files = self._snapshot(table)
            if len(files) < min_files:
                return 0
            con = duckdb.connect(":memory:")
            try:
                lst = "[" + ", ".join(sql_str(f) for f in files) + "]"
                merged = con.sql(f"{self._empty_select(table)} union all by name "
                                 f"select * from read_parquet({lst}, union_by_name=true)").to_arrow_table()
            except duckdb.Error as e:
                bad = corrupt_files(files)
                raise WarehouseError(self._corrupt_message(bad) if bad else str(e)) from None
            finally:
                con.close()
            merged = merged.select(self.schema.arrow[table].names).cast(self.schema.arrow[table])
            batch_id = new_batch_id()
            out = self._table_dir(table) / f"compact-{batch_id}.parquet"
            staged = write_parquet_atomic(merged, out, publish=False)
            record = {"output": out.name, "inputs": [f.name for f in files], "rows": merged.num_rows,
                      "created_at": datetime.now(timezone.utc).isoformat()}
            write_text_atomic(json.dumps(record), self._table_dir(table) / "_compactions" / f"{batch_id}.json")
            os.replace(staged, out)  # the commit point for readers
            fsync_dir(out.parent)
            return len(files)

    def describe(self, table: str) -> list[tuple[str, str, bool]]:
        """(column, SQL type, nullable) for a table."""
        if table not in TABLES:
            raise WarehouseError(f"unknown table {table!r}; tables are: {', '.join(TABLES)}")
        return [(c.name, c.sql_type, c.nullable) for c in self.schema.columns[table]]

    def __repr__(self) -> str:
        return f"Warehouse({str(self.root)!r}, schema_version={self.schema.version})"

