"""``cake evolve``'s options, generated from the run request (``cake_core.pipeline.request.RunRequest``).

Each field whose ``Param`` has a ``flag`` becomes the command's argument (``""``) or an option, with the
field's help text and metavar; a flag that takes no value (``--cold``, ``--no-filter``) asks for its
``Param.gives``. The fields the command fills from the settings (``Param.setting``) and those it leaves to the
flow are not options. A field added to the request is an option of ``cake evolve`` without a line here.
"""
from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from cake_core.pipeline.request import RunRequest, params


def cli_fields() -> list[str]:
    """The request's fields that ``cake evolve`` takes from its command line, in the request's order."""
    return [n for n, p in params().items() if p.flag is not None]


def _parameter(name: str, hint: Any) -> inspect.Parameter:
    p = params()[name]
    if p.flag == "":
        info = typer.Argument(..., metavar=p.metavar, help=p.help)
    elif p.gives is not None:
        info, hint = typer.Option(False, p.flag, help=p.help), bool
    else:
        info = typer.Option(None, p.flag, metavar=p.metavar, help=p.help)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=hint)


def request_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give command ``fn`` the request's options: ``fn(asked, **its own)`` gets ``asked``, the fields the command
    line gave by name (None: not given), before its own parameters (which follow the request's in ``--help``)."""
    hints = typing.get_type_hints(RunRequest)
    own = [q for q in inspect.signature(fn).parameters.values() if q.name != "asked"]
    names = cli_fields()

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        asked: dict[str, Any] = {}
        for n in names:
            v, p = kwargs.pop(n), params()[n]
            asked[n] = (p.gives if v else None) if p.gives is not None else v
        return fn(asked, **kwargs)

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_parameter(n, hints[n]) for n in names] + [q.replace(kind=inspect.Parameter.KEYWORD_ONLY) for q in own])
    return command


def absolute(asked: dict[str, Any], shape_file: Callable[[str], bool]) -> dict[str, Any]:
    """``asked`` with every path field (``Param.path``) that names an existing file made absolute: the flow may
    run in another directory. ``shape_file``: whether a shape set's value is a file rather than a set's name."""
    out = dict(asked)
    for n, v in asked.items():
        kind = params()[n].path
        if v is not None and kind and (kind == "file" or shape_file(v)) and Path(v).expanduser().is_file():
            out[n] = str(Path(v).expanduser().absolute())
    return out
