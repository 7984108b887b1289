"""Schema of the warehouse, read from the numbered SQL files in ``warehouse/schema/``.

``NNN_name.sql`` files run in order in a scratch in-memory DuckDB: ``create
table`` / ``alter table`` statements define each table's columns (turned into an
Arrow schema for the Parquet batches), ``create or replace view`` statements are
replayed on every query connection on top of the Parquet-backed tables. The
schema version is the highest ``NNN``. Migrations must be additive (new tables,
new nullable or defaulted columns, redefined views): old batches stay readable
because readers union files by column name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import duckdb
import pyarrow as pa

SCHEMA_DIR = Path(__file__).parent / "schema"
_FILE_RE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
_VIEW_NAME_RE = re.compile(r"view\s+\"?(\w+)", re.I)
_VIEW_RE = re.compile(r"^\s*(?:--[^\n]*\n\s*)*create\s+(?:or\s+replace\s+)?view\s", re.I)


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str
    nullable: bool
    default: str | None  # DuckDB expression text, evaluated at append time


@dataclass(frozen=True)
class Schema:
    version: int
    columns: dict[str, tuple[Column, ...]]  # table -> columns in declaration order
    arrow: dict[str, pa.Schema]             # table -> Arrow schema of its batches (all nullable)
    view_sql: tuple[str, ...]               # view statements, in file order
    views: tuple[str, ...]                  # view names, in file order


def _migration_files() -> list[tuple[int, Path]]:
    files = []
    for path in sorted(SCHEMA_DIR.iterdir()):
        m = _FILE_RE.match(path.name)
        if m:
            files.append((int(m.group(1)), path))
    numbers = [n for n, _ in files]
    if numbers != list(range(1, len(files) + 1)):
        raise RuntimeError(f"schema files in {SCHEMA_DIR} must be numbered 001, 002, ... without gaps; got {numbers}")
    return files


@lru_cache(maxsize=1)
def load_schema() -> Schema:
    """Run every migration in a scratch database and describe the result."""
    con = duckdb.connect(":memory:")
    view_sql: list[str] = []
    version = 0
    for version, path in _migration_files():
        for stmt in duckdb.extract_statements(path.read_text()):
            text = stmt.query.strip()
            con.execute(text)
            if _VIEW_RE.match(text):
                view_sql.append(text)
    tables = [r[0] for r in con.execute(
        "select table_name from duckdb_tables() where not internal order by table_name").fetchall()]
    columns: dict[str, tuple[Column, ...]] = {}
    arrow: dict[str, pa.Schema] = {}
    for t in tables:
        rows = con.execute(
            "select column_name, data_type, is_nullable, column_default from duckdb_columns() "
            "where table_name = ? order by column_index", [t]).fetchall()
        columns[t] = tuple(Column(n, ty, bool(nl), d) for n, ty, nl, d in rows)
        empty = con.sql(f'select * from "{t}" limit 0').to_arrow_table().schema
        # Stored batches are all-nullable: NOT NULL is enforced by validation, and rejected
        # rows (nulls included) must still be writable to quarantine.
        arrow[t] = pa.schema([f.with_nullable(True) for f in empty])
    views = tuple(dict.fromkeys(_VIEW_NAME_RE.search(v).group(1) for v in view_sql))
    con.close()
    return Schema(version, columns, arrow, tuple(view_sql), views)


def eval_default(column: Column) -> object:
    """Value of a column's DEFAULT expression now (timestamps in naive UTC)."""
    expr = column.default or ""
    if re.fullmatch(r"(current_timestamp|now\(\)|get_current_timestamp\(\))", expr.strip(), re.I):
        return datetime.now(timezone.utc).replace(tzinfo=None)
    with duckdb.connect(":memory:") as con:
        return con.execute(f"select cast({expr} as {column.sql_type})").fetchall()[0][0]
