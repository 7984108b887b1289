"""Load another test module by its path (the kernel texts a lowering or GPU test shares with its IR test), under a
name of its own, without making the test folders packages."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load(path: Path) -> ModuleType:
    """The module at ``path`` (e.g. ``Path(__file__).parents[1] / "ir" / "test_scalar.py"``), executed once per
    call under the name ``sibling_<folder>_<stem>``."""
    spec = importlib.util.spec_from_file_location(f"sibling_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
