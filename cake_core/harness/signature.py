"""Failure signatures: what makes two failed attempts "the same failure".

A signature is ``stage:outcome:key`` where key is the rule id when a
specific rule fired, else (no rule, or a generic one such as ``runtime.fault``)
the error message normalised (numbers, hex, quoted names and
paths replaced by placeholders) so that the same mistake at other sizes or
names falls in one cluster.
"""
from __future__ import annotations

import re

_NORMALISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"`[^`]*`"), "<name>"),
    (re.compile(r"'[^']*'"), "<name>"),
    (re.compile(r"(/[\w.\-]+)+"), "<path>"),
    (re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise(message: str) -> str:
    s = message.strip()
    for pat, rep in _NORMALISE:
        s = pat.sub(rep, s)
    return s[:160]


# Rules that name a kind of failure rather than its cause: the message tells causes apart.
GENERIC_RULES = frozenset({"runtime.fault", "runtime.timeout", "check.mismatch", "nvcc.error"})


def signature(stage: str, outcome: str, rule: str | None, message: str | None) -> str:
    if rule and rule not in GENERIC_RULES:
        key = rule
    else:
        key = f"{rule}:{normalise(message or '')}" if rule else normalise(message or "")
    return f"{stage}:{outcome}:{key}"
