"""How every ``cake`` command reports a problem: one red line on stderr and an exit code.

Exit codes: 2 for bad usage or configuration (a :class:`UsageError`, a bad
setting, an unknown problem or shape set, a run request no run can take, a
statement ``cake sql`` refuses),
1 for any other failure, 130 after Ctrl-C. An unexpected exception is one line
too; its traceback goes to ``<home>/logs/cli.log``.
"""
from __future__ import annotations

import datetime as dt
import functools
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import typer

from cake_cli.config import ConfigError
from cake_core.errors import CakeError


class UsageError(CakeError):
    """The command line asked for something that cannot be done as asked (exit code 2)."""


_home: list[Path] = []   # the home of this invocation once its settings are loaded (for cli.log)


def remember_home(home: Path | None) -> None:
    """Make ``home`` the place an unexpected error's traceback is written to (None: ``$CAKE_HOME``)."""
    _home[:] = [] if home is None else [home]


def _usage_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConfigError, UsageError]
    try:
        from cake_core.pipeline.request import RequestError
        from cake_core.problems import ShapeSetError, UnknownProblem
        types += [UnknownProblem, ShapeSetError, RequestError]
    except ImportError:
        pass
    try:
        from warehouse import ReadOnlyError   # a statement `cake sql` refuses is bad usage
        types.append(ReadOnlyError)
    except ImportError:
        pass
    return tuple(types)


def _reported_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [CakeError]
    try:
        from warehouse import WarehouseError
        types.append(WarehouseError)
    except ImportError:
        pass
    return tuple(types)


def _stopped_types() -> tuple[type[BaseException], ...]:
    """A flow run cancelled under a command (Prefect raises CancelledRun out of the flow call)."""
    try:
        from prefect.exceptions import CancelledRun
    except ImportError:
        return ()
    return (CancelledRun,)


def _home_for_log() -> Path:
    if _home:
        return _home[0]
    return Path(os.environ.get("CAKE_HOME") or ".cake").expanduser().absolute()


def say_error(message: str) -> None:
    """Print ``error: <message>`` in red on stderr, on one line whatever ``message`` holds."""
    # typer.secho, not rich: rich would wrap a long message over several lines.
    first = " ".join(str(message).split()) or "(no message)"
    typer.secho(f"error: {first}", fg="red", err=True)


def _log_internal(exc: BaseException) -> Path | None:
    """Append the traceback to <home>/logs/cli.log; return the path, or None if it cannot be written."""
    log = _home_for_log() / "logs" / "cli.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"--- {dt.datetime.now().isoformat(timespec='seconds')} "
                    f"cake {' '.join(sys.argv[1:])}\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return log


F = TypeVar("F", bound=Callable[..., Any])


def cli_errors(fn: F) -> F:
    """Turn every exception out of a command into one line on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # typer's own exits (typer >= 0.16 has its own classes) and usage errors
        except KeyboardInterrupt:
            say_error("interrupted")
            raise typer.Exit(130) from None
        except _stopped_types() as e:
            # a flow run cancelled under the command (Ctrl-C, SIGTERM, a `timeout`): what it recorded is kept
            say_error(f"stopped: {' '.join(str(e).split())}; what was recorded is kept: run the same command again "
                      "to go on")
            raise typer.Exit(130) from None
        except _reported_error_types() as e:
            say_error(str(e))
            raise typer.Exit(2 if isinstance(e, _usage_error_types()) else 1) from None
        except Exception as e:  # noqa: BLE001 - the last line of defence: one line, log the rest
            log = _log_internal(e)
            where = f"full traceback in {log}" if log else "traceback could not be written"
            msg = " ".join(str(e).split())
            say_error(f"internal: {type(e).__name__}: {msg} ({where})")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
