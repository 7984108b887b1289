import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # wh_fixtures, wh_workers (also for worker processes)

from wh_fixtures import dataset  # noqa: E402

from warehouse import Warehouse  # noqa: E402


@pytest.fixture
def wh(tmp_path):
    return Warehouse(tmp_path / "wh")


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A warehouse holding the whole fixture dataset (one batch per table)."""
    w = Warehouse(tmp_path_factory.mktemp("filled") / "wh")
    for table, rows in dataset().items():
        w.append(table, rows)
    return w
