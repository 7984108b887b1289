"""What every command of one ``cake`` invocation shares: its settings, the problems it can find, argument checks.

The settings are loaded and checked once per invocation (:func:`settings`; ``cake_cli.main``'s callback starts
a new invocation with :func:`forget_settings`). The command modules take these from here, not from the
module that registers them, so that no command module needs ``cake_cli.main``.
"""
from __future__ import annotations

from pathlib import Path

from cake_cli.config import Settings, load_settings
from cake_cli.errors import UsageError, remember_home

PROBLEM_PATH_HELP = ("A problem folder (an __init__.py defining PROBLEM, kernels/, shapes/) or a folder of them, "
                     "beside the built-in and installed problems; repeatable (also the problem_path setting).")

_settings_cache: list[Settings] = []   # the settings of this invocation, once loaded


def forget_settings() -> None:
    """Start a new invocation: the next :func:`settings` loads and checks the configuration again."""
    _settings_cache.clear()
    remember_home(None)


def settings() -> Settings:
    """Load and validate the configuration once per invocation."""
    if not _settings_cache:
        _settings_cache.append(load_settings())
        remember_home(_settings_cache[0].home)
        from cake_core.problems import use_problem_paths

        use_problem_paths(_settings_cache[0].problem_paths)
    return _settings_cache[0]


def problem_paths(paths: list[Path] | None) -> None:
    """Add ``--problem-path`` folders to the problems this invocation can find; a missing one is a UsageError."""
    from cake_core.problems import use_problem_paths

    for p in paths or []:
        if not p.is_dir():
            raise UsageError(f"--problem-path {p}: no such folder; pass a problem folder (one holding __init__.py "
                             "with PROBLEM) or a folder of them")
    use_problem_paths(paths or [])


def ir_file(file: Path) -> None:
    """A UsageError unless ``file`` is a readable file (a directory is not one)."""
    if file.is_dir():
        raise UsageError(f"{file} is a directory; pass a .cake file")
    if not file.is_file():
        raise UsageError(f"{file}: no such file")


def out_file(out: Path | None) -> None:
    """A UsageError if ``--out`` cannot be written: a directory, or in a folder that does not exist."""
    if out is None:
        return
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; name a file")
    if not out.absolute().parent.is_dir():
        raise UsageError(f"--out {out}: folder {out.absolute().parent} does not exist")


def warehouse(settings: Settings):
    """The warehouse under settings.home; a UsageError if no run has created it yet."""
    from warehouse import Warehouse

    root = settings.warehouse_root
    if not root.exists():
        raise UsageError(f"no warehouse at {root} yet; run `cake evolve PROBLEM` first, "
                         f"or set CAKE_HOME to the directory that holds warehouse/")
    return Warehouse(root)
