"""Errors raised by the warehouse; each message says what to do next."""

from __future__ import annotations

from pathlib import Path


class WarehouseError(Exception):
    """Anything the warehouse refuses: bad table/column, bad SQL, bad files, bad version."""


class BatchRejected(WarehouseError):
    """A batch failed its Great Expectations suite and was moved to quarantine.

    Attributes
    ----------
    table : str
        Table the batch was meant for.
    failed : list[str]
        One line per failed expectation, e.g. ``expect_column_values_to_be_in_set(outcome)``.
    parquet_path, report_path : Path
        Where the quarantined rows and the validation report were written.
    """

    def __init__(self, table: str, failed: list[str], parquet_path: Path, report_path: Path):
        self.table, self.failed = table, failed
        self.parquet_path, self.report_path = parquet_path, report_path
        super().__init__(
            f"batch for table {table!r} rejected by validation; failed expectations: "
            + "; ".join(failed)
            + f". Rows kept in {parquet_path}, report in {report_path}."
        )
