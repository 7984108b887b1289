"""Another home's runs, imported into this warehouse, so one harness review mines the runs of several homes.

Batch files are immutable and named uniquely (``<UTC time>-<pid>-<uuid>``), so importing is copying: each batch a
reader of the source sees now (``batches.list_batches``: compacted inputs left out) that this warehouse lacks is
copied under its own name, atomically; a compacted batch's record is copied first, so a reader here that also
holds its inputs (from an earlier import) drops them. Importing the same home again copies only what is new.

Only the run tables are imported. The harness tables (versions, proposals, decisions) and the cost-model
versions number their rows per home, so they stay where they were made; for the same reason a source whose
attempts ran under a learned harness version (not v0, the built-in harness) is refused: its version numbers name
changes this home does not have.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from warehouse.batches import TMP_SUFFIX, compaction_records, fsync_dir, list_batches, sql_str, write_text_atomic
from warehouse.errors import WarehouseError
from warehouse.store import TABLES, Warehouse

PER_HOME = ("harness_versions", "proposals", "decisions", "model_versions")
RUN_TABLES = tuple(t for t in TABLES if t not in PER_HOME)


def source_root(path: str | Path) -> Path:
    """The warehouse folder of ``path`` (a Cake home or its warehouse), or a WarehouseError saying what it is not."""
    p = Path(path).expanduser().resolve()
    for cand in (p, p / "warehouse"):
        if (cand / "SCHEMA_VERSION").is_file() and (cand / "landing").is_dir():
            return cand
    raise WarehouseError(f"{path}: not a Cake home or warehouse (no SCHEMA_VERSION and landing/ there or under "
                         "warehouse/); give the home whose runs to import")


def _learned_runs(src: Path) -> list[tuple[str, int]]:
    files = list_batches(src / "landing" / "attempts")
    if not files:
        return []
    con = duckdb.connect()
    try:
        rel = ", ".join(sql_str(f) for f in files)
        return con.execute(f"select run_id, max(harness_version) from read_parquet([{rel}], union_by_name=true) "
                           "where harness_version > 0 group by run_id order by run_id").fetchall()
    finally:
        con.close()


def _copy(src: Path, dest: Path) -> None:
    """A batch file copied under its own name: fsynced under a temporary name the readers skip, then renamed."""
    tmp = dest.with_name(f".{dest.name}{TMP_SUFFIX}")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)


def import_runs(dest: Warehouse, source: str | Path) -> dict[str, int]:
    """Copy ``source``'s run batches into ``dest``; returns the files copied per table (0: already here)."""
    src = source_root(source)
    if src == dest.root.resolve():
        raise WarehouseError(f"{source} is this home's own warehouse; give another home")
    version = int((src / "SCHEMA_VERSION").read_text().strip() or 0)
    if version > dest.schema.version:
        raise WarehouseError(f"{src} has schema version {version}, newer than this Cake's {dest.schema.version}; "
                             "upgrade Cake before importing it")
    learned = _learned_runs(src)
    if learned:
        runs = ", ".join(f"{r} (v{v})" for r, v in learned[:5]) + (" ..." if len(learned) > 5 else "")
        raise WarehouseError(f"{src}: {len(learned)} run(s) ran under a learned harness of that home: {runs}; "
                             "their harness versions name changes this home does not have; import a home whose "
                             "runs ran under v0")
    copied: dict[str, int] = {}
    for table in RUN_TABLES:
        sdir, ddir = src / "landing" / table, dest.root / "landing" / table
        (ddir / "_compactions").mkdir(parents=True, exist_ok=True)
        records = {r["output"]: Path(r["_path"]) for r in compaction_records(sdir)}
        n = 0
        for f in list_batches(sdir):
            if (ddir / f.name).exists():
                continue
            rec = records.get(f.name)
            if rec is not None and not (ddir / "_compactions" / rec.name).exists():
                # the record before its output, as compact() does
                write_text_atomic(rec.read_text(), ddir / "_compactions" / rec.name)
            _copy(f, ddir / f.name)
            n += 1
        if n:
            fsync_dir(ddir)
        copied[table] = n
    return copied
