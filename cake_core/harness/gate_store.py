"""The corpus gate's results on disk: a review replays only what no earlier review of this code replayed.

A review replays the whole corpus (every problem's kernel files and the best attempts) through the built-in
verifier and the interpreter: over a minute of CPU on fifty kernels, in every process that reviews (each
``cake evolve`` with a review, each experiment block resumed in a new call). Those results are pure: they depend
on the kernel's text (its IR hash), the shape, the input seed and Cake's own code, never on the harness under
review (learned rules are evaluated afresh each time). So each is kept as one small JSON file under a folder
named for a fingerprint of that code (every ``.py``, ``.cake`` and ``.json`` file of ``cake_core``, numpy's
version and Python's): changed code starts an empty folder, so a verdict is never reused across a change that
could alter it. Interpreter checks are kept for built-in problems only (a problem package from elsewhere has
its oracle outside ``cake_core``, which the fingerprint does not cover). An unreadable entry is computed again.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cake_core.outcome import Diagnostic, Severity
from cake_core.runtime.cpu import ShapeCheck

CODE_ROOT = Path(__file__).resolve().parents[1]          # cake_core
SUFFIXES = (".py", ".cake", ".json")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of the code a gate result depends on (see the module docstring)."""
    import numpy as np

    h = hashlib.sha256(f"python {sys.version}\nnumpy {np.__version__}\n".encode())
    for path in sorted(p for p in CODE_ROOT.rglob("*") if p.suffix in SUFFIXES and p.is_file()
                       and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(CODE_ROOT)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:20]


class GateStore:
    """Verifier diagnostics and interpreter checks of (IR hash, shape[, problem, seed]) under ``root``."""

    def __init__(self, root: Path):
        self.dir = Path(root) / code_fingerprint()

    def _path(self, kind: str, key: tuple) -> Path:
        digest = hashlib.sha256(json.dumps([kind, *key]).encode()).hexdigest()[:32]
        return self.dir / kind / f"{digest}.json"

    def _read(self, kind: str, key: tuple) -> Any | None:
        try:
            entry = json.loads(self._path(kind, key).read_text())
        except (OSError, ValueError):
            return None
        return entry["value"] if entry.get("key") == [kind, *key] else None

    def _write(self, kind: str, key: tuple, value: Any) -> None:
        path = self._path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"key": [kind, *key], "value": value}, f)
            os.replace(tmp, path)
        except OSError:
            pass     # a cache: a result not kept is computed again next time

    def diagnostics(self, key: tuple) -> tuple[Diagnostic, ...] | None:
        rows = self._read("verify", key)
        try:
            return None if rows is None else tuple(
                Diagnostic(r["rule"], Severity(r["severity"]), r["message"], r["line"], r["col"], r["path"],
                           r["hint"], tuple(r["witness"])) for r in rows)
        except (KeyError, TypeError, ValueError):
            return None

    def keep_diagnostics(self, key: tuple, diags: tuple[Diagnostic, ...]) -> None:
        self._write("verify", key, [d.to_dict() for d in diags])

    def check(self, key: tuple) -> ShapeCheck | None:
        value = self._read("check", key)
        try:
            return None if value is None else ShapeCheck(**value)
        except TypeError:
            return None

    def keep_check(self, key: tuple, chk: ShapeCheck) -> None:
        self._write("check", key, asdict(chk))
