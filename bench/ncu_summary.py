"""The stall reasons and the hottest SASS lines of an Nsight Compute report, as text.

    python3 bench/ncu_summary.py RAW.csv SASS.csv [--top 30]

RAW.csv is ``ncu -i R --page raw --csv``; SASS.csv is ``ncu -i R --page source --csv --print-source sass``
(bench/gpu.sh profile writes both). Prints, per profiled kernel, the warp stall reasons (cycles per issued
instruction, largest first), then the SASS instructions with the most stall samples, with their reasons.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


_STALL = "smsp__average_warps_issue_stalled_"


def _rows(path: Path) -> list[list[str]]:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith('"')]
    return list(csv.reader(lines))


def stalls(raw: Path) -> list[str]:
    rows = _rows(raw)
    if len(rows) < 3:
        return [f"{raw}: no metrics ({raw.read_text(errors='replace')[:200]!r})"]
    head, body = rows[0], rows[2:]   # names, units, then one row per kernel
    out = []
    for r in body:
        name = r[head.index("Kernel Name")] if "Kernel Name" in head else "?"
        pairs = []
        for h, v in zip(head, r):
            if h.startswith(_STALL) and h.endswith("_per_issue_active.ratio"):
                try:
                    pairs.append((float(v.replace(",", "")), h[len(_STALL):-len("_per_issue_active.ratio")]))
                except ValueError:
                    pass
        pairs.sort(reverse=True)
        out.append(f"{name}: stall cycles per issued instruction: "
                   + ", ".join(f"{k} {v:.2f}" for v, k in pairs[:10] if v >= 0.05))
    return out


def hot_sass(sass: Path, top: int) -> list[str]:
    rows = [r for r in _rows(sass) if r and r[0] != "Kernel Name"]   # one "Kernel Name" line per kernel
    if len(rows) < 2:
        return [f"{sass}: no source page"]
    head = rows[0]
    col = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    src = next((i for i, h in enumerate(head) if h == "Source"), None)
    addr = next((i for i, h in enumerate(head) if h == "Address"), None)
    if col is None or src is None:
        return [f"{sass}: columns {head[:12]}"]

    def num(s: str) -> float:
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0
    body = [r for r in rows[1:] if len(r) == len(head)]
    total = sum(num(r[col]) for r in body) or 1.0
    body.sort(key=lambda r: -num(r[col]))
    out = [f"hottest SASS ({int(total)} stall samples in all):"]
    for r in body[:top]:
        out.append(f"  {100 * num(r[col]) / total:5.1f}%  {r[addr] if addr is not None else ''}  {r[src].strip()}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("sass", type=Path)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    for path in (a.raw, a.sass):
        if not path.exists():
            print(f"ncu_summary: {path} is missing (did ncu write its report?)", file=sys.stderr)
            return 2
    print("\n".join(stalls(a.raw) + hot_sass(a.sass, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
