"""`cake check`: parse and verify an IR file, returning every diagnostic."""
from __future__ import annotations

from pathlib import Path

from cake_core.errors import CakeError
from cake_core.ir.text import parse
from cake_core.ir.verify import verify
from cake_core.outcome import Diagnostic


def check_text(text: str, filename: str = "<ir>", target: str | None = None) -> list[Diagnostic]:
    r = parse(text, filename)
    diags = list(r.diagnostics)
    if r.program is not None:
        diags += verify(r.program, target)
    return sorted(diags, key=lambda d: (d.line, d.col, d.rule))


def check_file(path: str | Path, target: str | None = None) -> list[Diagnostic]:
    p = Path(path)
    if not p.is_file():
        raise CakeError(f"no IR file at {p}; pass the path of a .cake file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CakeError(f"cannot read {p}: {e}") from None
    return check_text(text, str(p), target)
