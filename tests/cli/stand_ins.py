"""Stand-ins for the CLI tests: a warehouse that answers from tables a test sets, services that start nothing,
and modules put in place of real ones. Test modules import the fixtures they use from here."""
from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import pyarrow as pa
import pytest

import cake_cli.evolve_run as evolve_run
import cake_cli.harness_cli as harness_cli
import cake_cli.main as main
from cake_cli.services import PrefectServer


class WarehouseError(Exception):
    pass


class FakeWarehouse:
    """Answers like warehouse.Warehouse: pyarrow tables; queries are recorded."""

    tables: dict[str, pa.Table] = {}
    queries: list[tuple[str, list | None]] = []

    def __init__(self, root):
        self.root = Path(root)

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        FakeWarehouse.queries.append((sql, params))
        for key, table in FakeWarehouse.tables.items():
            if key in sql:
                return table
        raise WarehouseError(f"Catalog Error: Table with name nope does not exist! (in: {sql})")


@pytest.fixture
def warehouse(monkeypatch, tmp_path):
    """A stand-in `warehouse` package, and the warehouse folder it pretends to read."""
    import warehouse.queries as queries

    mod = types.ModuleType("warehouse")
    mod.Warehouse, mod.WarehouseError = FakeWarehouse, WarehouseError
    monkeypatch.setitem(sys.modules, "warehouse", mod)
    monkeypatch.setitem(sys.modules, "warehouse.queries", queries)     # the real reads, of the stand-in
    # the batches' validator `cake evolve` builds while its services start: nothing to build for the stand-in
    expectations = types.ModuleType("warehouse.expectations")
    expectations.warm_up = lambda: None
    monkeypatch.setitem(sys.modules, "warehouse.expectations", expectations)
    monkeypatch.setattr(queries, "Warehouse", FakeWarehouse)
    monkeypatch.setattr(FakeWarehouse, "tables", {})
    monkeypatch.setattr(FakeWarehouse, "queries", [])
    (tmp_path / "home" / "warehouse").mkdir(parents=True)
    return FakeWarehouse


@pytest.fixture
def no_services(monkeypatch):
    """prefect_server and ray_runtime that start nothing and record their use."""
    used: list[str] = []

    @contextlib.contextmanager
    def fake_prefect(settings):
        used.append("prefect")
        yield PrefectServer(api_url="http://127.0.0.1:4200/api", ui_url="http://127.0.0.1:4200",
                            started=False)

    @contextlib.contextmanager
    def fake_ray(settings, num_gpus=None, resources=None):
        used.append(f"ray:{num_gpus}")
        if resources:
            used.append(f"resources:{sorted(resources.items())}")
        yield None

    for module in (harness_cli, evolve_run):
        monkeypatch.setattr(module, "prefect_server", fake_prefect)
    monkeypatch.setattr(evolve_run, "ray_runtime", fake_ray)
    for module in (main, harness_cli):
        monkeypatch.setattr(module, "gpu_policy", lambda settings: [])
    return used


def fake_module(monkeypatch, name: str, **attrs):
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod
