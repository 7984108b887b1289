"""Cake's warehouse: every attempt of every run, as append-only Parquet batches queried with DuckDB.

>>> wh = Warehouse("~/.cake/warehouse")
>>> wh.append("attempts", rows)                      # validated (Great Expectations), then landed atomically
>>> wh.query("select * from failure_clusters limit 5")  # pyarrow.Table; works while flows write

See ``warehouse.store`` for the on-disk layout and the concurrency rules,
``warehouse/schema/*.sql`` for the tables and views, ``warehouse.expectations``
for the checks every batch must pass, ``warehouse.readonly`` for what a query may do.
"""

from warehouse.errors import BatchRejected, WarehouseError
from warehouse.readonly import ReadOnlyError
from warehouse.store import TABLES, Warehouse

__all__ = ["Warehouse", "WarehouseError", "ReadOnlyError", "BatchRejected", "TABLES"]
