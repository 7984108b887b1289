"""Landing a run's rows: one writer thread per run, appends retried on I/O, batch files compacted at the end.

Stages hand their rows to the run's :class:`Recorder` and go on while it lands them (Great Expectations
validates every batch first, which takes a good part of a second), child rows before the attempt rows that
mark them complete. ``flush`` waits until everything handed over has landed and raises what went wrong.
A crash loses only rows not landed yet, all of the generation being run: a generation counts as done once
its ``select`` row has landed after the rest, so a resumed run redoes it and records nothing twice
(``skip``: the attempt ids each table already holds).
"""
from __future__ import annotations

import queue
import threading
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from cake_core.pipeline.attempt import Attempt
from cake_core.pipeline.rows import CHILD_TABLES, merge_rows
from tasks.run_control import writing
from warehouse import TABLES, Warehouse

COMPACT_MIN_FILES = 8     # a table with this many batch files or more is merged at the end of a run


@retry(retry=retry_if_exception_type(OSError), stop=stop_after_attempt(4), wait=wait_exponential(0.2, max=2),
       reraise=True)
def append(wh: Warehouse, table: str, rows: list[dict[str, Any]]) -> int:
    """Append one batch, retried alone on I/O errors (each append is atomic: nothing lands twice)."""
    return wh.append(table, rows)


class Recorder:
    """The writer of one run: rows handed over land in order, in a thread of their own."""

    def __init__(self, warehouse_root: str, run_id: str | None = None):
        self.wh = Warehouse(warehouse_root)
        self.run_id = run_id                          # its writes stop once the run is asked to (run_control)
        self.skip: dict[str, set[str]] = {}          # table -> attempt ids it holds already (a redone generation)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="cake-recorder", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                table, rows = item
                if self._error is None:
                    with writing([self.run_id] if self.run_id else []):   # a stopped run writes nothing more
                        append(self.wh, table, rows)
            except BaseException as e:  # noqa: BLE001 - handed to the next flush
                self._error = e
            finally:
                self._queue.task_done()

    def rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Hand over rows of one table (nothing for an empty list)."""
        if rows:
            self._queue.put((table, rows))

    def attempts(self, attempts: list[Attempt]) -> int:
        """Hand over every row of these finished attempts: child rows first, the attempt rows last."""
        merged = merge_rows(attempts)
        for table in (*CHILD_TABLES, "attempts"):
            held = self.skip.get(table, set())
            self.rows(table, [r for r in merged.get(table, []) if r["attempt_id"] not in held])
        return len(attempts)

    def flush(self) -> None:
        """Wait until everything handed over has landed; raise the first error of the writer."""
        self._queue.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        """Land what is left and stop the writer."""
        try:
            self.flush()
        finally:
            self._queue.put(None)
            self._thread.join(timeout=60)


@task(name="compact", cache_policy=NO_CACHE)
def compact(warehouse_root: str, min_files: int = COMPACT_MIN_FILES) -> dict[str, int]:
    """Merge each table's batch files once it has ``min_files`` or more: every batch of a run lands its own
    small file, and queries slow down as they pile up. Returns files merged per table."""
    wh = Warehouse(warehouse_root)
    merged = {t: wh.compact(t, min_files=min_files) for t in TABLES}
    return {t: n for t, n in merged.items() if n}
