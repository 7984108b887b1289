"""Read-only SQL over the warehouse: which statements may run, and a DuckDB that can read only the batches.

Two barriers, each enough against a different class of escape:

1. **Statements.** DuckDB's own parser splits and classifies the text
   (``duckdb.extract_statements``); only ``SELECT`` (``DESCRIBE``, ``SHOW``,
   ``SUMMARIZE``, ``FROM t`` and ``VALUES`` parse as ``SELECT``) and
   ``EXPLAIN [ANALYZE]`` of a ``SELECT`` may run. ``EXPLAIN ANALYZE`` executes
   its statement, so the statement inside an ``EXPLAIN`` is found with DuckDB's
   tokenizer and classified in turn. Everything else (``COPY``, ``ATTACH``,
   ``INSTALL``/``LOAD``, ``PRAGMA``, ``SET``/``RESET``, ``CALL``, ``CREATE``,
   ``INSERT``, ``EXPORT``, transactions, prepared statements) is refused before
   a connection exists.
2. **The connection.** External access is off with the landed batch files as
   the only allowed paths, Python replacement scans and extension autoloading
   are off, and the configuration is locked. Any file reader on another path
   (``read_csv('/etc/passwd')``, ``glob``, a Parquet file elsewhere, a URL),
   ``ATTACH``, ``INSTALL`` and ``LOAD`` fail inside DuckDB even if a statement
   got past the first barrier.

DuckDB lets an allowed path be written as well as read, so the first barrier is
what keeps a ``COPY ... TO '<a landed batch>'`` out; the tests try both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import duckdb

from warehouse.errors import WarehouseError

ALLOWED_HINT = ("ask with SELECT (DESCRIBE, SHOW, SUMMARIZE and EXPLAIN [ANALYZE] SELECT work too); "
                "export with --format csv|json|parquet --out FILE")

# Applied in this order: allowed_paths and the switches must be set while external access is
# still on (DuckDB refuses to widen access afterwards), the lock last.
_LOCKDOWN = (
    ("python_enable_replacements", "false"),        # no `select * from some_python_variable`
    ("autoload_known_extensions", "false"),         # no extension loaded behind a function call
    ("autoinstall_known_extensions", "false"),      # ... nor downloaded
    ("allow_community_extensions", "false"),
    ("enable_external_access", "false"),            # no file, URL or database but the allowed paths
    ("lock_configuration", "true"),                 # no SET / RESET / PRAGMA can undo the above
)


class ReadOnlyError(WarehouseError):
    """A statement that could write, reach outside the warehouse or change the configuration."""


def _sql_str(s: str | Path) -> str:
    return "'" + str(s).replace("'", "''") + "'"


# DuckDB's statement type names where they would puzzle a user (INSTALL parses as LOAD).
_KIND_NAMES = {"LOAD": "INSTALL/LOAD", "VARIABLE_SET": "SET VARIABLE", "COPY_DATABASE": "COPY DATABASE",
               "CREATE_FUNC": "CREATE FUNCTION", "MERGE_INTO": "MERGE"}


def _describe(statement_type: duckdb.StatementType) -> str:
    return _KIND_NAMES.get(statement_type.name, statement_type.name.replace("_", " "))


def _tokens(text: str) -> list[tuple[int, str, str]]:
    """(offset, kind, text) of each token, comments dropped; ``kind`` is DuckDB's token type name."""
    raw = duckdb.tokenize(text)
    out = []
    for i, (start, kind) in enumerate(raw):
        end = raw[i + 1][0] if i + 1 < len(raw) else len(text)
        name = str(kind).rsplit(".", 1)[-1]
        if name != "comment":
            out.append((start, name, text[start:end].strip()))
    return out


def _explained(text: str) -> list[str]:
    """The texts that may be the statement an ``EXPLAIN [ANALYZE] [(options)]`` runs.

    ``EXPLAIN (select 1)`` and ``EXPLAIN (format json) select 1`` both open with a
    parenthesis, so both readings are returned; the caller classifies every one
    that parses.
    """
    toks = _tokens(text)
    i = 1  # toks[0] is EXPLAIN
    if i < len(toks) and toks[i][2].lower() in ("analyze", "analyse"):
        i += 1
    if i >= len(toks):
        return []
    rest = text[toks[i][0]:]
    readings = [rest]
    if toks[i][1] == "operator" and toks[i][2].startswith("("):
        depth = 0
        for j in range(i, len(toks)):
            if toks[j][1] == "operator":
                depth += toks[j][2].count("(") - toks[j][2].count(")")
                if depth <= 0:
                    readings.append(text[toks[j][0] + len(toks[j][2]):] if j + 1 == len(toks)
                                    else text[toks[j + 1][0]:])
                    break
    return readings


def _refusal(kind: str, text: str) -> ReadOnlyError:
    one_line = " ".join(text.split())
    shown = one_line if len(one_line) <= 80 else one_line[:77] + "..."
    return ReadOnlyError(f"the warehouse is read-only: {kind} statements are refused ({shown}); "
                         f"{ALLOWED_HINT}")


def _check_one(statement: duckdb.Statement, depth: int = 0) -> None:
    if statement.type is duckdb.StatementType.SELECT:
        return
    if statement.type is not duckdb.StatementType.EXPLAIN or depth > 2:
        raise _refusal(_describe(statement.type), statement.query)
    inner: list[duckdb.Statement] = []
    for reading in _explained(statement.query):
        try:
            parsed = duckdb.extract_statements(reading)
        except duckdb.Error:
            continue
        if len(parsed) == 1:
            inner.append(parsed[0])
    if not inner:
        raise _refusal("EXPLAIN of an unrecognised", statement.query)
    for s in inner:
        if s.type is not duckdb.StatementType.SELECT:
            raise _refusal(f"EXPLAIN {_describe(s.type)}", statement.query)


def read_only_statements(sql: str) -> list[duckdb.Statement]:
    """Split ``sql`` into statements and refuse any that is not read-only.

    Parameters
    ----------
    sql
        One or more SQL statements.

    Returns
    -------
    list of duckdb.Statement
        The statements, in order, all read-only.

    Raises
    ------
    ReadOnlyError
        A statement could write, attach, install or load, or change a setting.
    WarehouseError
        The text does not parse, or holds no statement.
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise WarehouseError(str(e)) from None
    if not statements:
        raise WarehouseError("empty query")
    for s in statements:
        _check_one(s)
    return statements


def locked_connection(files: Iterable[Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that can read ``files`` and nothing else, with its configuration locked.

    Parameters
    ----------
    files
        The batch files its views will read (absolute paths).

    Returns
    -------
    duckdb.DuckDBPyConnection
        A connection on which file readers of other paths, ``ATTACH``,
        ``INSTALL``, ``LOAD`` and every configuration change fail.
    """
    con = duckdb.connect(":memory:")
    try:
        paths = ", ".join(_sql_str(Path(f).absolute()) for f in files)
        con.execute(f"set allowed_paths = [{paths}]")
        for name, value in _LOCKDOWN:
            con.execute(f"set {name} = {value}")
    except BaseException:
        con.close()
        raise
    return con


def outside_message(e: duckdb.Error) -> str:
    """The message for a read DuckDB refused because it names a file outside the warehouse."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return (f"the warehouse reads only its own batch files: {first}; query its tables and views "
            f"instead (`cake sql` lists them on a malformed query)")
