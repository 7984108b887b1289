"""Frozen records read from JSON: every field present, of its declared type, and nothing else.

A target file that misses a key, has one more, or a value of the wrong type is refused with one
message naming the file and the key: a misspelt limit must not fall back to a default silently.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from cake_core.errors import CakeError

R = TypeVar("R")


class TargetDataError(CakeError):
    """A target data file is malformed: the message names the file, the key and what is wrong."""


def load_record(cls: type[R], path: Path) -> R:
    """Read ``path`` (a JSON object) into the frozen dataclass ``cls``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TargetDataError(f"cannot read target data {path}: {e}") from None
    return _record(cls, data, str(path))


def _record(cls: type[R], data: Any, where: str) -> R:
    if not isinstance(data, dict):
        raise TargetDataError(f"{where}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        what = "; ".join(x for x in (f"unknown key(s) {', '.join(unknown)}" if unknown else "",
                                     f"missing key(s) {', '.join(missing)}" if missing else "") if x)
        raise TargetDataError(f"{where}: {what} (the keys of {cls.__name__}: {', '.join(names)})")
    return cls(**{n: _value(hints[n], data[n], f"{where}: `{n}`") for n in names})


def _value(hint: Any, v: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):           # `X | None`: the key is present, its value may be null
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, v, where)
    if dataclasses.is_dataclass(hint):
        return _record(hint, v, where)
    if origin is tuple:
        if not isinstance(v, list):
            raise TargetDataError(f"{where} must be a list, got {v!r}")
        item = args[0]
        return tuple(_value(item, x, f"{where}[{i}]") for i, x in enumerate(v))
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if hint is float else \
        type(v) is hint
    if not ok:
        raise TargetDataError(f"{where} must be {hint.__name__}, got {v!r}")
    return float(v) if hint is float else v
