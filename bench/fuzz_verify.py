"""Seeded mutations of every corpus kernel through the verifier, the protocol checker and the interpreter.

    python3 bench/fuzz_verify.py --mutants 3000 --seed 0 --out $OUT     # the long run
    python3 bench/fuzz_verify.py --mutants 160 --seed 15 --stage-s 60   # what tests/ir/test_fuzz.py runs

Each mutant is a corpus program (every ``.cake`` of every problem's ``kernels/``) with one to three random
edits at the node level: a constant set to 0, 1, a negative, a huge or a neighbouring value; a thread count,
role warp range or register budget moved; an mbarrier's count or arrivals changed; a slot index or a wait
phase replaced; a statement dropped, duplicated or moved into (out of) a role, loop or ``if``; two statements
swapped; a buffer name replaced by another (or an undefined one); a dtype changed; an ``if`` condition
replaced (an undefined name, a float, a CTA parity); the cluster shape changed; a loop bound or a grid extent
changed (a float, a zero divisor, off a tile multiple, huge). These reach the defect kinds the verifier must
name: undefined names in conditions and operands, mbarriers and register tiles in the wrong block, clusters
that do not divide the grid, missing fences, narrowing dtypes, ragged trip counts. The mutant's canonical text
is parsed back (an edit that does not round-trip is itself a finding), then verified (every rule, the protocol
checker included) and, if it verifies, lowered to CUDA (a verified mutant the lowering refuses is counted with
the lowering's rule: a case the verifier should name) and run by the interpreter on the problem's smallest CPU
shape.

A finding is a **crash** (any exception out of parse, verify or the interpreter other than the interpreter's
own ``InterpFault``) or a **hang** (a stage past ``--stage-s`` seconds of CPU time, or twenty times that of
wall time). Diagnostics and interpreter faults are the expected answers (``protocol.undecided`` among the
diagnostics and ``interp.budget`` among the faults, a launch past the interpreter's step budget: counted
apart). ``tests/ir/test_fuzz.py`` runs a few hundred mutants with a generous stage bound (a busy CI
machine); this script, with its default ``--stage-s 5``, measures the bound every check must meet. Prints a
table of counts last (the slowest stage in CPU seconds), writes every finding (mutant number, problem, edits,
program text, stage, traceback), the slowest stages (overall and of each stage) and the launches the
interpreter refused over its step budget (with their CPU seconds) to ``fuzz.json`` under ``--out``; exit 1
when there is a finding.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.ir.expr import Bin, Cmp, Sym  # noqa: E402
from cake_core.ir.ops import Node, Op, make_attrs  # noqa: E402
from cake_core.ir.ops import Slot  # noqa: E402
from cake_core.ir.program import Program  # noqa: E402
from cake_core.ir.text import parse, parse_program  # noqa: E402
from cake_core.ir.types import DType  # noqa: E402
from cake_core.ir.verify import verify  # noqa: E402
from cake_core.problems import list_problems  # noqa: E402

PROBLEMS = {p.name: p for p in list_problems()}

HUGE = (0, 1, -1, -64, 3, 7, 1000, 65536, 10 ** 9)
SLOWEST = 10    # the slowest stages kept in the result


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def corpus() -> list[tuple[str, Program]]:
    """(problem, program) for every stored kernel, with the problem whose ``kernels/`` holds it (two problems may
    share parameter names: the KDA decode and prefill)."""
    files = sorted(((f, name) for name, prob in PROBLEMS.items() for f in prob.kernels_dir.glob("*.cake")),
                   key=lambda fn: fn[0].name)      # the order of corpus_files: by file name
    return [(name, parse_program(f.read_text(), str(f))) for f, name in files]


def _nodes(body: tuple[Node, ...], path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Node]]:
    out = []
    for i, n in enumerate(body):
        out.append((path + (i,), n))
        out += _nodes(n.body, path + (i,))
    return out


def _edit(body: tuple[Node, ...], path: tuple[int, ...], fn: Callable[[tuple[Node, ...], int], tuple[Node, ...]]):
    """Apply ``fn(block, index)`` to the block holding the node at ``path``."""
    if len(path) == 1:
        return fn(body, path[0])
    i = path[0]
    inner = _edit(body[i].body, path[1:], fn)
    return body[:i] + (replace(body[i], body=inner),) + body[i + 1:]


def _names(p: Program) -> list[str]:
    return [n.result for _, n in _nodes(p.body) if n.result] + [q.name for q in p.params]


def mutate(p: Program, rng: random.Random) -> tuple[Program, str]:
    """One random edit and its description."""
    nodes = _nodes(p.body)
    kind = rng.choice(["const", "threads", "role", "mbarrier", "slot", "phase", "drop", "dup", "swap", "name",
                       "dtype", "attr", "move", "cond", "cluster", "expr", "grid"])
    if kind == "const" and p.consts:
        k = rng.choice([k for k, _ in p.consts])
        v = rng.choice(HUGE + (p.const_env[k] * 2, p.const_env[k] // 2, p.const_env[k] + 1))
        return p.with_consts(**{k: v}), f"const {k}={v}"
    if kind == "threads":
        v = rng.choice((0, 1, 31, 32, 96, 128, 384, 1024, 2048, 4096))
        return replace(p, threads=v), f"threads={v}"
    roles = [(path, n) for path, n in nodes if n.op is Op.ROLE]
    if kind == "role" and roles:
        path, n = rng.choice(roles)
        lo, hi = n.args[1]
        choice = rng.choice(["warps", "regs"])
        if choice == "warps":
            w = rng.choice([(lo, lo), (hi, lo), (0, 10 ** 6), (lo, hi + 4), (lo - 4, hi), (0, 1)])
            new = replace(n, args=(n.args[0], w))
        else:
            new = replace(n, attrs=make_attrs(Op.ROLE, {**dict(n.attrs), "regs": rng.choice((0, 8, 24, 25, 256, 512))}))
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), f"role {choice}"
    bars = [(path, n) for path, n in nodes if n.op is Op.MBARRIER]
    if kind == "mbarrier" and bars:
        path, n = rng.choice(bars)
        if rng.random() < 0.5:
            new = replace(n, args=(rng.choice((0, 1, 10 ** 6, 10 ** 9, Sym("N"))),))
        else:
            new = replace(n, attrs=make_attrs(Op.MBARRIER, {"arrivals": rng.choice((0, -1, 3, 10 ** 6))}))
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), "mbarrier"
    slots = [(path, n) for path, n in nodes if any(isinstance(a, Slot) and a.index is not None for a in n.args)]
    if kind in ("slot", "phase") and slots:
        path, n = rng.choice(slots)
        if kind == "phase" and n.op is Op.WAIT:
            ph = rng.choice((0, 1, 2, -1, Bin("+", n.args[1], 1), Sym("K")))
            new = replace(n, args=(n.args[0], ph))
        else:
            idx = rng.choice((0, 1, 7, -1, 10 ** 6, Sym("K"), Bin("+", Sym("N"), 1)))
            new = replace(n, args=tuple(Slot(a.buf, idx) if isinstance(a, Slot) and a.index is not None else a
                                        for a in n.args))
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), kind
    if kind == "drop" and nodes:
        path, n = rng.choice(nodes)
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + b[i + 1:])), f"drop {n.op.value}"
    if kind == "dup" and nodes:
        path, n = rng.choice(nodes)
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i + 1] + (b[i],) + b[i + 1:])), f"dup {n.op.value}"
    if kind == "swap" and nodes:
        path, n = rng.choice(nodes)

        def sw(b, i):
            j = rng.randrange(len(b))
            lst = list(b)
            lst[i], lst[j] = lst[j], lst[i]
            return tuple(lst)
        return replace(p, body=_edit(p.body, path, sw)), "swap"
    with_bufs = [(path, n) for path, n in nodes if any(isinstance(a, str) for a in n.args)]
    if kind == "name" and with_bufs:
        path, n = rng.choice(with_bufs)
        other = rng.choice(_names(p) + ["undefined_buf"])
        args = list(n.args)
        js = [j for j, a in enumerate(args) if isinstance(a, str)]
        args[rng.choice(js)] = other
        new = replace(n, args=tuple(args))
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), f"name -> {other}"
    allocs = [(path, n) for path, n in nodes if n.op in (Op.SMEM, Op.RMEM)]
    if kind == "dtype" and allocs:
        path, n = rng.choice(allocs)
        new = replace(n, args=(rng.choice(list(DType)),) + n.args[1:])
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), "dtype"
    attrd = [(path, n) for path, n in nodes if n.attrs]
    if kind == "attr" and attrd:
        path, n = rng.choice(attrd)
        k, v = rng.choice(list(n.attrs))
        nv = rng.choice((0, 1, -1, 10 ** 6)) if isinstance(v, int) and not isinstance(v, bool) else \
            (not v if isinstance(v, bool) else v)
        new = replace(n, attrs=tuple(sorted({**dict(n.attrs), k: nv}.items())))
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), f"attr {k}={nv}"
    if kind == "move" and nodes:
        # a statement moved into (or out of) a block: an mbarrier or a tile allocated inside a role, a role's
        # op at the top level, a fence or a sync in a loop
        path, n = rng.choice(nodes)
        blocks = [(q, m) for q, m in nodes if m.body and q[:len(path)] != path]
        if blocks:
            body = _edit(p.body, path, lambda b, i: b[:i] + b[i + 1:])
            q, m = rng.choice(blocks)
            q = _shifted(q, path)
            if q is not None:
                k = rng.randint(0, len(m.body))
                body = _edit(body, q, lambda b, i: b[:i] + (replace(b[i], body=b[i].body[:k] + (n,)
                                                                              + b[i].body[k:]),) + b[i + 1:])
                return replace(p, body=body), f"move {n.op.value} into {m.op.value}"
    ifs = [(path, n) for path, n in nodes if n.op is Op.IF]
    if kind == "cond" and ifs:
        path, n = rng.choice(ifs)
        c = rng.choice((Cmp("==", Sym("undefined_dim"), 0), Cmp("<", Sym("bid.x"), 1.5), Cmp(">", Sym("K"), 0),
                        Cmp("==", Bin("%", Sym("bid.x"), 2), 1), Cmp("<", Sym("N"), 10 ** 9)))
        new = replace(n, args=(c,) + n.args[1:])
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), f"cond {c}"
    clusters = [(path, n) for path, n in nodes if n.op is Op.CLUSTER]
    if kind == "cluster" and clusters:
        path, n = rng.choice(clusters)
        dims = rng.choice(((3, 1, 1), (1, 2, 1), (2, 2, 1), (0, 1, 1), (16, 1, 1), (4, 1, 1)))
        new = replace(n, args=(dims,) + n.args[1:])
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), f"cluster {dims}"
    loops = [(path, n) for path, n in nodes if n.op is Op.FOR]
    if kind == "expr" and loops:
        # a loop bound changed: a float, a zero divisor, a bound that is no tile multiple, a huge trip count
        path, n = rng.choice(loops)
        stop = n.args[1]
        new_stop = rng.choice((Bin("//", stop, 0), Bin("+", stop, 1), Bin("-", stop, 1), 1.5, 0, 10 ** 7,
                               Bin("*", stop, 1000), Bin("//", Sym("K"), 64)))
        new = replace(n, args=(n.args[0], new_stop) + n.args[2:])
        return replace(p, body=_edit(p.body, path, lambda b, i: b[:i] + (new,) + b[i + 1:])), "loop bound"
    if kind == "grid":
        g = list(p.grid)
        j = rng.randrange(len(g))
        g[j] = rng.choice((0, 1, 3, Bin("+", g[j], 1), Bin("//", g[j], 0), Bin("*", g[j], 2), 10 ** 9))
        return replace(p, grid=tuple(g)), "grid"
    return p.with_consts(), "none"


def _shifted(q: tuple[int, ...], removed: tuple[int, ...]) -> tuple[int, ...] | None:
    """The path ``q`` once the node at ``removed`` is gone (None when ``q`` was inside it)."""
    if q[:len(removed)] == removed:
        return None
    k = len(removed) - 1
    if len(q) > k and q[:k] == removed[:k] and q[k] > removed[k]:
        return q[:k] + (q[k] - 1,) + q[k + 1:]
    return q


# a stage's wall time may exceed its CPU bound this many times on a loaded machine before it is a hang anyway
WALL_FACTOR = 20


def run_stage(fn: Callable[[], Any], seconds: float) -> tuple[str, Any, float]:
    """('ok', value) or ('crash', traceback) or ('hang', None), with the CPU seconds it took.

    The bound is on the process's CPU time (what the stage costs one core, however busy the machine),
    with a wall-clock backstop of WALL_FACTOR times it for a stage that blocks without computing."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, seconds * WALL_FACTOR)
    c0 = time.process_time()
    try:
        return "ok", fn(), time.process_time() - c0
    except Hang:
        return "hang", None, time.process_time() - c0
    except Exception:  # noqa: BLE001 - a crash is what this looks for
        return "crash", traceback.format_exc(limit=6), time.process_time() - c0
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)


def fuzz(mutants: int, seed: int, stage_s: float = 5.0, interpret: bool = True, trace: bool = False) -> dict[str, Any]:
    from cake_core.ir import interp
    from cake_core.runtime.cpu import _poisoned  # the gate's own poisoned outputs
    rng = random.Random(seed)
    progs = corpus()
    from cake_core.lower import lower
    counts = {"mutants": 0, "verified": 0, "rejected": 0, "undecided": 0, "lower_refused": 0, "interpreted": 0,
              "faults": 0, "over_budget": 0, "crash": 0, "hang": 0}
    findings, timed, over_budget, lower_refused = [], [], [], []
    slowest = last_s = 0.0          # the slowest stage so far, and the last stage's seconds
    by_stage: dict[str, tuple] = {}

    def took(stage: str, dt: float) -> None:
        nonlocal slowest, last_s
        slowest, last_s = max(slowest, dt), dt
        t = (round(dt, 3), stage, i, prob, what)
        timed.append(t)
        timed.sort(key=lambda t: -t[0])
        del timed[SLOWEST:]
        if t[0] >= by_stage.get(stage, (-1.0,))[0]:
            by_stage[stage] = t
    def stage(name: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run stage ``name`` of the current mutant: (True, its result), or (False, None) after a crash or a hang,
        which is recorded as a finding."""
        status, out, dt = run_stage(fn, stage_s)
        took(name, dt)
        if status == "ok":
            return True, out
        counts[status] += 1
        findings.append({"mutant": i, "problem": prob, "stage": name, "kind": status, "edits": what,
                         "program": text, "trace": out, "seconds": round(dt, 2)})
        return False, None

    for i in range(mutants):
        prob, base = progs[i % len(progs)]
        p, what = base, []
        for _ in range(rng.randint(1, 3)):
            p, w = mutate(p, rng)
            what.append(w)
        counts["mutants"] += 1
        if trace:
            print(f"{i}: {prob} {what}", file=sys.stderr, flush=True)
        text = p.text() if _printable(p) else None
        if text is None:
            continue
        ok, r = stage("parse", lambda: parse(text, "mutant.cake"))
        if not ok:
            continue
        if r.program is None:
            counts["rejected"] += 1
            continue
        shape = _small_shape(prob)
        ok, diags = stage("verify", lambda: verify(r.program, shapes=[shape]))
        if not ok:
            continue
        if any(d.is_error for d in diags):
            counts["rejected"] += 1
            counts["undecided"] += any(d.rule == "protocol.undecided" for d in diags)
            continue
        counts["verified"] += 1
        ok, low = stage("lower", lambda: lower(r.program, "mutant.cake"))
        if not ok:
            continue
        if not low.ok:     # verified, then refused by the lowering: a case the verifier should have named
            counts["lower_refused"] += 1
            first = low.diagnostics[0] if low.diagnostics else None
            lower_refused.append({"mutant": i, "problem": prob, "edits": what, "program": text,
                                  "rule": first.rule if first else "", "message": first.message if first else ""})
        if not interpret:
            continue
        problem = PROBLEMS[prob]
        import numpy as np
        x = problem.make_inputs(shape, np.random.default_rng(i))

        def go():
            try:
                interp.run(r.program, shape, x, _poisoned(problem, r.program, shape, x))
            except interp.InterpFault as e:
                return e
            return None
        ok, res = stage("interpret", go)
        if ok:
            counts["interpreted"] += 1
            counts["faults"] += res is not None
            if res is not None and res.rule == "interp.budget":
                counts["over_budget"] += 1
                over_budget.append({"mutant": i, "problem": prob, "edits": what, "seconds": round(last_s, 3),
                                    "fault": str(res)})
    counts["slowest_check_s"] = round(slowest, 3)

    def row(t: tuple) -> dict[str, Any]:
        return dict(zip(("seconds", "stage", "mutant", "problem", "edits"), t))
    return {"counts": counts, "findings": findings, "slowest": [row(t) for t in timed],
            "slowest_by_stage": {k: row(t) for k, t in by_stage.items()}, "over_budget": over_budget,
            "lower_refused": lower_refused}


def _printable(p: Program) -> bool:
    try:
        p.text()
        return True
    except Exception:  # noqa: BLE001 - an edit the printer cannot write is not a program text
        return False


def _small_shape(prob: str) -> dict[str, int]:
    problem = PROBLEMS[prob]
    ss = problem.shape_set(problem.shape_sets[0])
    return min(ss.shapes, key=lambda s: sum(s.values()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage-s", type=float, default=5.0, help="a stage past this many CPU seconds is a hang")
    ap.add_argument("--no-interp", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--trace", action="store_true", help="print each mutant's edits to stderr before its checks")
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = fuzz(args.mutants, args.seed, args.stage_s, not args.no_interp, args.trace)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fuzz.json").write_text(json.dumps(res, indent=1, default=str))
    for f in res["findings"][:20]:
        print(f"-- {f['kind']} in {f['stage']} after {f['edits']}\n{(f['trace'] or '')[-800:]}")
    c = res["counts"]
    refused: dict[str, int] = {}
    for m in res["lower_refused"]:
        refused[m["rule"]] = refused.get(m["rule"], 0) + 1
    if refused:
        print("verified, then refused by the lowering: " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
    print("\n| mutants | rejected | of which undecided | verified | of which the lowering refused | interpreted | of "
          "which faulted | of which over budget | crashes | hangs | slowest check s | total s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {c['mutants']} | {c['rejected']} | {c['undecided']} | {c['verified']} | {c['lower_refused']} "
          f"| {c['interpreted']} | {c['faults']} | {c['over_budget']} | {c['crash']} | {c['hang']} "
          f"| {c['slowest_check_s']} | {res['seconds']} |")
    return 1 if c["crash"] or c["hang"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
