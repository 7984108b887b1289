"""A warehouse's batch files on disk: ids, atomic writes, what a reader lists, stale temporaries.

Plain files only, no DuckDB: ``warehouse.store`` reads and merges what these functions write and list. The
layout and the rules that make concurrent appends, reads and compactions safe are in ``warehouse.store``'s
docstring; :func:`list_batches` is the reader's half of them, :func:`prune_compacted` the compactor's
cleanup.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

TMP_SUFFIX = ".tmp"
_STALE_TMP_S = 6 * 3600          # a temp file this old is abandoned whoever wrote it
_DEAD_WRITER_TMP_S = 60          # ... or this old when its writer's pid is gone
_BATCH_PID_RE = re.compile(r"^\.?(?:compact-)?\d{8}T\d{12}Z-(\d+)-")


def new_batch_id() -> str:
    """Unique, time-ordered batch id: ``<UTC time>-<pid>-<uuid>``."""
    now = datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S%f}Z-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_parquet_atomic(table: pa.Table, path: Path, *, publish: bool = True) -> Path:
    """Write to ``.<name>.tmp`` in the same folder, fsync, rename onto ``path``.

    With ``publish=False`` the fsynced temp file is left for the caller to rename.
    """
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    if not publish:
        return tmp
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def write_text_atomic(text: str, path: Path) -> None:
    # a temporary name of its own per writer: two processes opening a new warehouse at once both write
    # SCHEMA_VERSION, and a shared temporary file would be renamed away under one of them
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def vanished(files: Iterable[Path]) -> bool:
    """Whether a batch file a reader listed is gone (a compaction pruned it)."""
    return any(not f.exists() for f in files)


def file_identity(files: list[Path]) -> list[tuple]:
    """Each file with its size and modification time (a vanished one as None)."""
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((f, st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            out.append((f, None, None))
    return out


def sql_str(s: str | Path) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def compaction_records(table_dir: Path) -> list[dict]:
    """The compaction records of a table folder, oldest first, each with its own ``_path``."""
    rdir = table_dir / "_compactions"
    out = []
    for name in sorted(os.listdir(rdir)) if rdir.exists() else []:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            out.append(json.loads((rdir / name).read_text()) | {"_path": str(rdir / name)})
        except FileNotFoundError:
            continue  # pruned meanwhile: its inputs are gone too
    return out


def list_batches(table_dir: Path) -> list[Path]:
    """The batch files a reader must see now: no duplicates, no gaps (see ``warehouse.store``)."""
    # Batch files first, compaction records second: if a compacted output is listed,
    # its record was committed before and is listed too.
    try:
        names = [n for n in os.listdir(table_dir) if n.endswith(".parquet") and not n.startswith(".")]
    except FileNotFoundError:
        return []
    present, hidden = set(names), set()
    for rec in compaction_records(table_dir):
        if rec["output"] in present:
            hidden.update(rec["inputs"])
    return [table_dir / n for n in sorted(present - hidden)]


def corrupt_files(files: Iterable[Path]) -> list[tuple[Path, str]]:
    """The files whose Parquet footer cannot be read, with the reason (a vanished file is not corrupt)."""
    bad = []
    for f in files:
        try:
            pq.read_metadata(f)
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 - any failure to read the footer means corrupt
            bad.append((f, str(e)))
    return bad


def clean_stale_tmp(folders: Iterable[Path]) -> None:
    """Delete the temporary files in ``folders`` that their writer abandoned (old, or its process gone)."""
    now = time.time()
    for d in folders:
        for name in os.listdir(d) if d.exists() else []:
            if not name.endswith(TMP_SUFFIX):
                continue
            p = d / name
            try:
                age = now - p.stat().st_mtime
            except FileNotFoundError:
                continue
            m = _BATCH_PID_RE.match(name)
            dead = m is not None and not _pid_alive(int(m.group(1)))
            if age > _STALE_TMP_S or (dead and age > _DEAD_WRITER_TMP_S):
                p.unlink(missing_ok=True)


def prune_compacted(table_dir: Path, grace_s: float) -> None:
    """Delete inputs of compactions older than ``grace_s``, then their records."""
    now = datetime.now(timezone.utc)
    for rec in compaction_records(table_dir):
        age = (now - datetime.fromisoformat(rec["created_at"])).total_seconds()
        if age < grace_s:
            continue
        if (table_dir / rec["output"]).exists():
            for name in rec["inputs"]:
                (table_dir / name).unlink(missing_ok=True)
            fsync_dir(table_dir)
        else:
            staged = table_dir / f".{rec['output']}{TMP_SUFFIX}"
            staged.unlink(missing_ok=True)  # compactor died before the commit point
        Path(rec["_path"]).unlink(missing_ok=True)
        fsync_dir(Path(rec["_path"]).parent)
