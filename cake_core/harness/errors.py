"""Errors of the harness package that reach a person."""
from __future__ import annotations

from cake_core.errors import CakeError


class HarnessDataError(CakeError):
    """A harness version, proposal payload or composite definition that does not read as what it claims."""
