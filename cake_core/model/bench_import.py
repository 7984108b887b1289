"""Read the corpus bench's result files (``bench/corpus_vs_peers.py`` JSON) as measured samples.

One file is one run per problem in it (run id ``bench-<file stem>-<problem>``, started at the file's
date), so held-out splits by run are splits by file. Each of our programs in a file is an attempt: its
IR text is the program file as it was when measured. The file records the program's path and ptxas'
report (registers, shared memory) but not its text, and the corpus files changed during the day; so the
text is looked for among the file's versions in git near the measurement's time (the first commit at or
after it, then the one before, then the working tree) and taken from the first version whose ptxas report
today has the recorded registers and shared memory (``check``), else whose shared memory alone matches
(the lowering moves registers, and it changed during the day too). A program no version matches is left
out and said so: its features would describe another kernel than the one timed.

Only correct, measured rows land; the peers' rows are not ours and stay out.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from cake_core.errors import CakeError

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBLEMS_REL = "cake_core/problems"        # <problem>/kernels/<file>.cake
LEGACY_KERNELS_REL = "cake_core/problems/seeds"     # where every kernel file lay before problems were packages
GIT_WINDOW = timedelta(hours=8)


class BenchFileError(CakeError):
    """A bench result file that cannot be read as one."""


@dataclass
class BenchProgram:
    key: str                    # the file's key, e.g. "PROBLEM/best:KERNEL.cake"
    problem: str
    path: str                   # relative to the repository root
    kernel: str
    resources: dict[str, int]   # ptxas' report when measured
    text: str | None = None
    source: str = ""            # "file", "git:<sha>" or "tree"; why it is missing otherwise
    note: str = ""
    embedded: str | None = None  # the IR text the result file itself holds (bench files since 2026-12-02)


@dataclass
class BenchMeasurement:
    problem: str
    program_key: str
    shape: dict[str, int]
    shape_key: str
    role: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    timer: str
    l2: str
    max_error: float | None


@dataclass
class BenchFile:
    path: Path
    stem: str
    date: datetime              # naive UTC
    gpu: str
    command: str
    programs: dict[str, BenchProgram] = field(default_factory=dict)
    measurements: list[BenchMeasurement] = field(default_factory=list)
    skipped_rows: int = 0

    def run_id(self, problem: str) -> str:
        return f"bench-{self.stem}-{problem}"


def _program_path(key: str) -> tuple[str, str]:
    problem, _, rest = key.partition("/")
    if ":" in rest:                                     # "seed:x.cake" / "best:x.cake"
        return problem, f"{PROBLEMS_REL}/{problem}/kernels/{rest.split(':', 1)[1]}"
    return problem, rest


def read_bench_file(path: str | Path) -> BenchFile:
    """Parse one result file; raises BenchFileError naming what is missing."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise BenchFileError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise BenchFileError(f"{path}: not a JSON bench result ({e})") from None
    missing = [k for k in ("date", "gpu", "programs", "rows") if k not in d] if isinstance(d, dict) else ["(object)"]
    if missing:
        raise BenchFileError(f"{path}: not a corpus_vs_peers result: no {', '.join(missing)}")
    try:
        date = datetime.strptime(d["date"].replace(" UTC", ""), "%Y-%m-%d %H:%M:%S")
    except (AttributeError, ValueError):
        raise BenchFileError(f"{path}: date {d.get('date')!r} is not 'YYYY-MM-DD HH:MM:SS UTC'") from None
    bf = BenchFile(path, path.stem, date, str(d["gpu"]), str(d.get("command", "")))
    by_kernel: dict[tuple[str, str], str] = {}
    for key, info in d["programs"].items():
        problem, rel = _program_path(key)
        res = (info or {}).get("resources") or {}
        text = (info or {}).get("text")
        bf.programs[key] = BenchProgram(key, problem, rel, str((info or {}).get("kernel", "")),
                                        {k: int(v) for k, v in res.items() if isinstance(v, (int, float))},
                                        embedded=text if isinstance(text, str) and text.strip() else None)
        by_kernel[(problem, bf.programs[key].kernel)] = key
        if rel.endswith("/" + problem + ".cake") or key.startswith(f"{problem}/seed:"):
            by_kernel[(problem, "seed")] = key
    for row in d["rows"]:
        ours = row.get("ours") or []
        for o in ours:
            if o.get("outcome") != "measured" or not o.get("correct") or not o.get("median_ms"):
                bf.skipped_rows += 1
                continue
            key = by_kernel.get((row["problem"], o.get("program", "")))
            if key is None:
                bf.skipped_rows += 1
                continue
            bf.measurements.append(BenchMeasurement(
                row["problem"], key, dict(row["shape"]), row["shape_key"], row.get("role", "headline"),
                float(o["median_ms"]), float(o.get("p10_ms") or o["median_ms"]),
                float(o.get("p90_ms") or o["median_ms"]), int(o.get("runs") or 1),
                str(o.get("timer") or "cuda_event"), str(o.get("l2") or "cold"),
                float(o["max_error"]) if o.get("max_error") is not None else None))
    return bf


# ---------------------------------------------------------------- program texts


def _git(repo: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def candidate_texts(rel: str, when: datetime, repo: Path = REPO_ROOT) -> list[tuple[str, str]]:
    """(source, text) versions of ``rel`` to try, most likely first: the first commit at or after ``when``,
    the last before it, the other commits within GIT_WINDOW by distance, then the working tree."""
    out: list[tuple[str, str]] = []
    # a kernel file's history before it moved into its problem's package is under the old shared folder
    legacy = f"{LEGACY_KERNELS_REL}/{rel.rsplit('/', 1)[-1]}" if "/kernels/" in rel else None
    log = "\n".join(filter(None, (_git(repo, "log", "--all", "--format=%H %ct", "--", r) for r in (rel, legacy) if r)))
    if log:
        commits = []
        for line in filter(None, log.splitlines()):
            sha, _, ts = line.partition(" ")
            t = datetime.fromtimestamp(int(ts), timezone.utc).replace(tzinfo=None)
            if abs(t - when) <= GIT_WINDOW:
                commits.append((t, sha))
        after = sorted(c for c in commits if c[0] >= when)
        before = sorted((c for c in commits if c[0] < when), reverse=True)
        ordered = after[:1] + before[:1] + sorted(after[1:] + before[1:], key=lambda c: abs(c[0] - when))
        for _, sha in ordered:
            text = _git(repo, "show", f"{sha}:{rel}")
            if text is None and legacy:
                text = _git(repo, "show", f"{sha}:{legacy}")
            if text is not None and (f"git:{sha[:12]}", text) not in out:
                out.append((f"git:{sha[:12]}", text))
    f = repo / rel
    if f.is_file():
        text = f.read_text()
        if not any(t == text for _, t in out):
            out.append(("tree", text))
    return out


Check = Callable[[str], dict[str, int] | str]


def resolve_texts(bf: BenchFile, check: Check | None, repo: Path = REPO_ROOT) -> None:
    """Set each program's ``text`` (see the module docstring). ``check(text)`` returns today's ptxas
    resources of a text (or a reason it has none); without it (no nvcc) the first candidate is taken and
    the note says that it was not checked."""
    for p in bf.programs.values():
        cands = ([("file", p.embedded)] if p.embedded else []) + [
            c for c in candidate_texts(p.path, bf.date, repo) if c[1] != p.embedded]
        if not cands:
            p.source, p.note = "", f"{p.path} is neither in git history nor in the working tree"
            continue
        if check is None:
            p.source, p.text = cands[0]
            p.note = "not checked against the recorded ptxas report (no nvcc)"
            continue
        seen, smem_only = [], None
        for source, text in cands:
            got = check(text)
            if isinstance(got, str):
                seen.append(f"{source}: {got}")
                continue
            same = {k: got.get(k) == p.resources.get(k) for k in ("registers", "smem_bytes") if k in p.resources}
            if all(same.values()):
                p.source, p.text = source, text
                break
            if same.get("smem_bytes") and smem_only is None:
                smem_only = (source, text, got.get("registers"))
            seen.append(f"{source}: {got.get('registers')} regs, {got.get('smem_bytes')} B smem")
        else:
            if smem_only is not None:
                # the IR fixes shared memory; registers also move with the lowering, which changed since
                p.source, p.text = smem_only[0], smem_only[1]
                p.note = (f"shared memory matches, registers do not ({smem_only[2]} today, "
                          f"{p.resources.get('registers')} recorded): the lowering changed since")
            else:
                p.note = (f"no version matches the recorded {p.resources.get('registers')} regs, "
                          f"{p.resources.get('smem_bytes')} B smem ({'; '.join(seen)})")


def ptxas_check(cache_dir: Path) -> Check:
    """A ``check`` that lowers and compiles a text (cached) and returns its ptxas resources."""
    from dataclasses import asdict

    from cake_core.ir.text import parse
    from cake_core.lower import compile_kernel, lower
    from cake_core.outcome import Outcome

    def check(text: str) -> dict[str, int] | str:
        r = parse(text, "bench.cake")
        if not r.ok:
            return "does not parse today"
        low = lower(r.program, "bench.cake")
        if low.outcome is not Outcome.OK:
            return "does not lower today"
        comp = compile_kernel(low.value, arch=r.program.target, cache_dir=cache_dir)
        if comp.outcome is not Outcome.OK:
            return "does not compile today"
        return asdict(comp.value.resources)

    return check


def attempt_id(run_id: str, text: str) -> str:
    return hashlib.sha256(f"{run_id}\0{text}".encode()).hexdigest()[:32]


def _run_row(run_id: str, problem: str, shape_set: str, agent: str, host: str, population: int, gpu: str,
             when: datetime, harness_version: int) -> dict[str, Any]:
    """A landed run: one generation, completed when it started (measurements that were taken elsewhere)."""
    return {"run_id": run_id, "problem": problem, "shape_set": shape_set, "harness_version": harness_version,
            "agent": agent, "seed": 0, "generations": 1, "population": population, "host": host,
            "gpu_model": gpu, "started_at": when, "status": "completed", "finished_at": when}


def _attempt_row(aid: str, run_id: str, problem: str, prog: Any, text: str, agent: str, tactic: str,
                 harness_version: int, when: datetime) -> dict[str, Any]:
    from cake_core.ir.features import features
    return {"attempt_id": aid, "run_id": run_id, "generation": 0, "problem": problem, "ir_hash": prog.hash,
            "ir_text": text, "agent": agent, "tactic": tactic, "harness_version": harness_version, "stage": "time",
            "outcome": "measured", "features": json.dumps(features(prog), default=str), "created_at": when}


def _compile_row(aid: str, text: str, arch: str, res: dict[str, Any], where: str) -> dict[str, Any]:
    """The ptxas report as recorded with the measurement (not today's: the lowering moves registers)."""
    return {"attempt_id": aid, "source_hash": hashlib.sha256(text.encode()).hexdigest(), "arch": arch,
            "seconds": 0.0, "registers": res.get("registers"), "spill_bytes": res.get("spill_bytes"),
            "smem_bytes": res.get("smem_bytes"), "barriers": res.get("barriers"), "cached": True, "ok": True,
            "log": f"ptxas report as {where}"}


def warehouse_rows(bf: BenchFile, harness_version: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The runs, attempts, compiles and measurements rows of a resolved file (programs without text left
    out), keyed by table."""
    from cake_core.ir.text import parse

    rows: dict[str, list[dict[str, Any]]] = {"runs": [], "attempts": [], "compiles": [], "measurements": []}
    problems = sorted({m.problem for m in bf.measurements})
    parsed: dict[str, Any] = {}
    for key, p in bf.programs.items():
        if p.text is not None:
            r = parse(p.text, p.path)
            if r.ok:           # not a program recovered around parse errors: it lacks the failed statements
                parsed[key] = r.program
    for problem in problems:
        run_id = bf.run_id(problem)
        ms = [m for m in bf.measurements if m.problem == problem and m.program_key in parsed]
        if not ms:
            continue
        rows["runs"].append(_run_row(run_id, problem, f"bench:{bf.stem}", "corpus", "bench",
                                     len({m.program_key for m in ms}), bf.gpu, bf.date, harness_version))
        landed: set[str] = set()
        for key in sorted({m.program_key for m in ms}):
            prog, bp = parsed[key], bf.programs[key]
            aid = attempt_id(run_id, prog.text())
            if aid in landed:                           # the same text under two names: one attempt
                rows["measurements"] += _measurement_rows(bf, run_id, aid, [m for m in ms if m.program_key == key])
                continue
            landed.add(aid)
            rows["attempts"].append(_attempt_row(aid, run_id, problem, prog, prog.text(), "corpus",
                                                 f"bench:{bp.key}@{bp.source}", harness_version, bf.date))
            if bp.resources.get("registers") is not None:
                rows["compiles"].append(_compile_row(aid, prog.text(), prog.target, bp.resources,
                                                     f"recorded in {bf.path.name}"))
            rows["measurements"] += _measurement_rows(bf, run_id, aid, [m for m in ms if m.program_key == key])
    return rows


def _measurement_rows(bf: BenchFile, run_id: str, aid: str, ms: list[BenchMeasurement]) -> list[dict[str, Any]]:
    return [{"attempt_id": aid, "run_id": run_id, "shape": m.shape_key, "gpu_model": bf.gpu, "timer": m.timer,
             "l2": m.l2, "median_ms": m.median_ms, "p10_ms": min(m.p10_ms, m.median_ms),
             "p90_ms": max(m.p90_ms, m.median_ms), "runs": m.runs, "correct": True, "max_error": m.max_error,
             "kind": "search", "measured_at": bf.date} for m in ms]


# ------------------------------------------------------------------ sample files (`cake model export-samples`)

SAMPLE_COLUMNS = ("run_id", "problem", "started_at", "attempt_id", "ir_text", "shape", "gpu_model", "timer",
                  "l2", "median_ms", "p10_ms", "p90_ms", "runs", "registers", "spill_bytes", "smem_bytes")


def sample_rows(records: list[dict[str, Any]], stem: str,
                harness_version: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The runs, attempts, compiles and measurements rows of an exported sample file's records (one per
    measured (attempt, shape), the columns of :data:`SAMPLE_COLUMNS`). Each record keeps its run id, so a
    held-out split by run still holds out the run it came from; a text that no longer parses is left out
    (its features could not be read) and listed under ``left_out``, its attempt id and the parser's reason."""
    from cake_core.ir.text import parse

    missing = [c for c in SAMPLE_COLUMNS if records and c not in records[0]]
    if missing:
        raise BenchFileError(f"{stem}: not a sample file of `cake model export-samples`: no {', '.join(missing)}")
    rows: dict[str, list[dict[str, Any]]] = {"runs": [], "attempts": [], "compiles": [], "measurements": [],
                                              "left_out": []}
    runs: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    bad: set[str] = set()
    for r in records:
        if r["attempt_id"] in bad:
            continue
        if r["attempt_id"] not in done:
            parsed = parse(r["ir_text"], "sample.cake")
            if parsed.program is None:
                bad.add(r["attempt_id"])
                why = parsed.diagnostics[0].message if parsed.diagnostics else "does not parse"
                rows["left_out"].append({"attempt_id": r["attempt_id"], "why": f"does not parse today: {why}"})
                continue
            prog = parsed.program
            done.add(r["attempt_id"])
            rows["attempts"].append(_attempt_row(r["attempt_id"], r["run_id"], r["problem"], prog, r["ir_text"],
                                                 "samples", f"samples:{stem}", harness_version, r["started_at"]))
            if r["registers"] is not None:
                rows["compiles"].append(_compile_row(r["attempt_id"], r["ir_text"], prog.target, r,
                                                     f"exported in {stem}"))
        runs.setdefault(r["run_id"], _run_row(r["run_id"], r["problem"], f"samples:{stem}", "samples", "samples", 0,
                                              r["gpu_model"], r["started_at"], harness_version))
        rows["measurements"].append({
            "attempt_id": r["attempt_id"], "run_id": r["run_id"], "shape": r["shape"], "gpu_model": r["gpu_model"],
            "timer": r["timer"], "l2": r["l2"], "median_ms": r["median_ms"], "p10_ms": r["p10_ms"],
            "p90_ms": r["p90_ms"], "runs": r["runs"], "correct": True, "max_error": None, "kind": "search",
            "measured_at": r["started_at"]})
    for a in rows["attempts"]:
        runs[a["run_id"]]["population"] += 1
    rows["runs"] = [runs[k] for k in sorted(runs) if runs[k]["population"]]
    return rows
