"""Verifier rules for the asynchronous MMAs (wgmma, tcgen05_mma) and the fused epilogues that read their
accumulator fragments: argmin_bias here, topk_bias in ``rules_topk`` through the shared
:func:`fragment_state_checks` and :func:`fragment_dtype_checks`.

Every limit comes from the target data (``cake_core.targets.Arch``: ``wgmma``, ``mma_atoms``,
``warpgroup_warps``).
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from cake_core.ir.opdef import Completion, Family
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.registry import ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, layouts, stages_of
from cake_core.ir.types import DType, MemSpace
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

# the MMAs a role issues asynchronously: smem operands, a commit group retired by a wait
_ASYNC_MMAS = frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is Completion.MMA_GROUP)


# -------------------------------------------------------------------- wgmma

def _mmas(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op in _ASYNC_MMAS:
            yield n, path


@rule("async.atom_target", "async", "wgmma needs sm_90a; tcgen05_mma needs sm_100a", guards=_ASYNC_MMAS)
def _atom_target(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        atom = REGISTRY[n.op].atom_of(n)
        if atom not in ctx.target.mma_atoms:
            yield ctx.diag("async.atom_target", n, f"`{n.op.value}` does not exist on {ctx.target.arch}",
                           path=path, hint=f"atoms on {ctx.target.arch}: {', '.join(ctx.target.mma_atoms)}")


@rule("wgmma.role", "wgmma", "wgmma is issued by whole warpgroups that start at a warp index divisible by 4",
      guards=_ASYNC_MMAS)
def _wgmma_role(ctx: Ctx) -> Iterable[Diagnostic]:
    per = ctx.target.warpgroup_warps
    for n, path in _mmas(ctx):
        r = ctx.role_of.get(id(n))
        lo, hi = r.args[1] if r is not None else (0, ctx.program.threads // ctx.target.warp_size)
        if lo % per or (hi - lo) % per:
            who = f"role `{r.args[0]}` (warps [{lo}, {hi}))" if r is not None else f"threads={ctx.program.threads}"
            yield ctx.diag("wgmma.role", n, f"{n.op.value} issued by {who}: not whole warpgroups", path=path,
                           hint="give the MMA role warps=(4*i, 4*j)")


def _mma_tiles(ctx: Ctx, n: Node):
    acc = ctx.buffers.get(n.arg("acc"))
    a, b = ctx.buffers.get(n.arg("a").buf), ctx.buffers.get(n.arg("b").buf)
    return acc, a, b


def _register_a(ctx: Ctx, n: Node) -> bool:
    """Whether wgmma ``n`` reads a from registers: a 16-bit fragment of its own role (``ir.fragments``)."""
    held = layouts(ctx).get(n.arg("a").buf)
    return n.op is Op.WGMMA and held is not None and held.kind == "frag" and held.role is ctx.role_of.get(id(n)) \
        and n.arg("a").index is None and ctx.buffers[n.arg("a").buf].dtype in (DType.BF16, DType.F16)


def _smem_tiles(ctx: Ctx, n: Node):
    """acc, a and b for the shape rules (wgmma.m, .n, .k): an a or b outside shared memory is None (a register A
    aside), since wgmma.operands reports its space and its shape (a whole gmem tensor) says nothing more."""
    acc, a, b = _mma_tiles(ctx, n)
    a = a if a is not None and (a.space is MemSpace.SMEM or _register_a(ctx, n)) else None
    return acc, a, (b if b is not None and b.space is MemSpace.SMEM else None)


def _a_mk(ctx: Ctx, n: Node, a) -> tuple[int | None, int | None]:
    """(M, K) of wgmma's a: (rows, columns) K-major, (columns, rows) with a_major="m"."""
    r, c = ctx.static(a.shape[0]), ctx.static(a.shape[1])
    return (c, r) if n.op is Op.WGMMA and n.attr("a_major") == "m" else (r, c)


def _b_kn(ctx: Ctx, n: Node, b) -> tuple[int | None, int | None]:
    """(K, N) of wgmma's b: (rows, columns) N-major, (columns, rows) with b_major="k"."""
    k, nn = ctx.static(b.shape[0]), ctx.static(b.shape[1])
    return (nn, k) if n.op is Op.WGMMA and n.attr("b_major") == "k" else (k, nn)


@rule("wgmma.acc", "wgmma", "the wgmma accumulator is an rmem f32 tile", guards=_ASYNC_MMAS)
def _wgmma_acc(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        acc = ctx.buffers.get(n.arg("acc"))
        if acc is not None and (acc.space is not MemSpace.RMEM or acc.dtype is not DType.F32 or acc.rank != 2):
            yield ctx.diag("wgmma.acc", n, f"accumulator `{n.arg('acc')}` is {acc}; wgmma accumulates into a 2-D "
                                           "rmem f32 tile", path=path, hint="allocate it as rmem(f32, (BM, BN))")


@rule("wgmma.m", "wgmma", "wgmma computes M = 64 rows per warpgroup", guards=_ASYNC_MMAS)
def _wgmma_m(ctx: Ctx) -> Iterable[Diagnostic]:
    if ctx.target.wgmma is None:
        return                  # no wgmma on this target: async.atom_target says so
    m = ctx.target.wgmma.m
    for n, path in _mmas(ctx):
        acc, a, _ = _smem_tiles(ctx, n)
        if acc is None or a is None or acc.rank != 2 or a.rank != 2:
            continue
        rows, arows, wgs = ctx.static(acc.shape[0]), _a_mk(ctx, n, a)[0], ctx.warpgroups_of(n)
        if rows != m * wgs or arows != rows:
            yield ctx.diag("wgmma.m", n, f"acc has {rows} rows and a has {arows}; {wgs} warpgroup(s) compute "
                                         f"{m * wgs} rows ({m} each)", path=path,
                           hint=f"use BM = {m} * warpgroups of the role")


@rule("wgmma.n", "wgmma", "wgmma's N is 8..256 in steps of 8, the same in acc and b", guards=_ASYNC_MMAS)
def _wgmma_n(ctx: Ctx) -> Iterable[Diagnostic]:
    w = ctx.target.wgmma
    if w is None:
        return
    for n, path in _mmas(ctx):
        acc, _, b = _smem_tiles(ctx, n)
        if acc is None or b is None or acc.rank != 2 or b.rank != 2:
            continue
        nn, bn = ctx.static(acc.shape[1]), _b_kn(ctx, n, b)[1]
        if nn is None:
            continue
        if not (w.n_min <= nn <= w.n_max and nn % w.n_step == 0) or bn != nn:
            kmaj = n.op is Op.WGMMA and n.attr("b_major") == "k"
            yield ctx.diag("wgmma.n", n, f"N = {nn} (b has {bn} {'rows' if kmaj else 'columns'}): wgmma takes N in "
                                         f"{w.n_min}..{w.n_max}, step {w.n_step}, equal in acc and b",
                           path=path, hint="pick BN among 64, 128, 256" + (
                               "; with b_major=\"k\" b is (BN, BK)" if kmaj else ""))


@rule("wgmma.k", "wgmma", "wgmma's K tile is a multiple of 16 (16-bit) or 32 (8-bit) and a and b agree",
      guards=_ASYNC_MMAS)
def _wgmma_k(ctx: Ctx) -> Iterable[Diagnostic]:
    w = ctx.target.wgmma
    if w is None:
        return
    for n, path in _mmas(ctx):
        _, a, b = _smem_tiles(ctx, n)
        if a is None or b is None or a.rank != 2 or b.rank != 2:
            continue
        k, bk = _a_mk(ctx, n, a)[1], _b_kn(ctx, n, b)[0]
        step = w.k_8bit if a.dtype.bytes == 1 else w.k_16bit
        if k is None or k % step or bk != k:
            yield ctx.diag("wgmma.k", n, f"K = {k} (b has {bk} along K): wgmma steps K by {step} for "
                                         f"{a.dtype.value}; a and b must agree", path=path,
                           hint=f"use BK a multiple of {step}")


@rule("wgmma.operands", "wgmma", "wgmma's a and b live in smem, share a 16-bit (or 8-bit) dtype and a swizzle",
      guards=_ASYNC_MMAS)
def _wgmma_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _mmas(ctx):
        _, a, b = _mma_tiles(ctx, n)
        if a is None or b is None:
            continue
        reg_a = _register_a(ctx, n)
        if (a.space is not MemSpace.SMEM and not reg_a) or b.space is not MemSpace.SMEM:
            for name, t in (("a", a), ("b", b)):
                if t.space is MemSpace.SMEM or (name == "a" and reg_a):
                    continue
                if name == "a" and t.space is MemSpace.RMEM and n.op is Op.WGMMA:
                    yield ctx.diag("wgmma.operands", n, f"wgmma's a `{n.arg('a').buf}` is an rmem tile but not a "
                                                        "16-bit fragment of the wgmma's role: a register A is a "
                                                        "(64 * warpgroups, K) bf16 or f16 rmem tile allocated in "
                                                        "the role that issues the wgmma", path=path,
                                   hint=f"allocate `{n.arg('a').buf}` = rmem(bf16, (BM, K)) inside the role and "
                                        "cast the accumulator into it, or copy it to an smem tile")
                    continue
                where = "a from shared memory or a 16-bit register fragment of its role, b" if n.op is Op.WGMMA \
                    else "a and b"
                yield ctx.diag("wgmma.operands", n, f"wgmma's {name} `{n.arg(name).buf}` lives in {t.space.value}: "
                                                    f"{n.op.value} reads {where} from shared memory", path=path,
                               hint=f"allocate `{n.arg(name).buf}` with smem(...) and copy it there first")
            continue
        if a.dtype != b.dtype or a.dtype not in (DType.BF16, DType.F16, DType.E4M3, DType.E5M2):
            yield ctx.diag("wgmma.operands", n, f"a is {a.dtype.value}, b is {b.dtype.value}: wgmma takes one "
                                                "16-bit (bf16/f16) or 8-bit float dtype", path=path,
                           hint="allocate both as bf16")
        elif reg_a and not _register_a_b_fits(ctx, n, b):
            yield ctx.diag("wgmma.operands", n, f"with a register A, b `{n.arg('b').buf}` {fmt_shape(ctx, b.shape)} "
                                                f"(swizzle={ctx.swizzle_of(n.arg('b').buf)}) is read through a "
                                                "swizzle=128 descriptor: K-major (N, 64) rows, or N-major (K, N) "
                                                "with N a multiple of 64", path=path,
                           hint=f"allocate `{n.arg('b').buf}` as smem(bf16, (BK, BN), swizzle=128) with BN a "
                                "multiple of 64, loaded by TMA with the same swizzle")
        elif not reg_a and ctx.swizzle_of(n.arg("a").buf) != ctx.swizzle_of(n.arg("b").buf):
            sa, sb = ctx.swizzle_of(n.arg("a").buf), ctx.swizzle_of(n.arg("b").buf)
            yield ctx.diag("wgmma.operands", n, f"a has swizzle={sa}, b has swizzle={sb}: "
                                                "the descriptors of one wgmma use one layout", path=path,
                           hint="allocate both with swizzle=128 (and load them with TMA of the same swizzle)")


def _register_a_b_fits(ctx: Ctx, n: Node, b: Any) -> bool:
    """Whether the b of a register-A wgmma is a tile its lowering reads: swizzle=128, and N-major with whole
    128-byte spans of N (a K-major b's rows are wgmma.b_major's)."""
    if ctx.swizzle_of(n.arg("b").buf) != 128:
        return False
    if n.attr("b_major") == "k" or b.rank != 2:
        return True
    cols = ctx.static(b.shape[1])
    return cols is None or (cols * b.dtype.bytes % 128 == 0 and cols % 8 == 0)


def _majored(ctx: Ctx, attr: str, value: str, operand: str):
    """(wgmma, path, the 2-D tile of ``operand``) for each wgmma whose ``attr`` is ``value``."""
    for n, path in _mmas(ctx):
        if n.op is Op.WGMMA and n.attr(attr) == value:
            t = ctx.buffers.get(n.arg(operand).buf)
            if t is not None and t.rank == 2:
                yield n, path, t


@rule("wgmma.a_major", "wgmma", "an M-major a (a_major=\"m\") is a 16-bit (K, M) smem tile with swizzle=128, one "
                              "128-byte span of columns per warpgroup", guards=(Op.WGMMA,))
def _wgmma_a_major(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, a in _majored(ctx, "a_major", "m", "a"):
        if a.space is not MemSpace.SMEM:
            yield ctx.diag("wgmma.a_major", n, f"a_major=\"m\" reads `{n.arg('a').buf}` from {a.space.value}: an "
                                               "M-major a is an smem tile (a register A is K-major, the "
                                               "accumulator's layout)", path=path,
                           hint="drop a_major, or copy the tile to smem(bf16, (BK, BM), swizzle=128)")
            continue
        span, cols, wgs = ctx.swizzle_of(n.arg("a").buf), ctx.static(a.shape[1]), ctx.warpgroups_of(n)
        if a.dtype not in (DType.BF16, DType.F16) or span != 128 or cols is None or \
                cols * a.dtype.bytes != span * wgs:
            yield ctx.diag("wgmma.a_major", n, f"a_major=\"m\" reads `{n.arg('a').buf}` {fmt_shape(ctx, a.shape)} "
                                               f"{a.dtype.value} (swizzle={span}) as K rows of M: it must be a 16-bit "
                                               f"tile with swizzle=128 and {64 * wgs} columns, one 128-byte span for "
                                               f"each of the role's {wgs} warpgroup(s)", path=path,
                           hint=f"allocate it as smem(bf16, (BK, {64 * wgs}), swizzle=128)")


@rule("wgmma.b_major", "wgmma", "a K-major b (b_major=\"k\") is an (N, K) smem tile with swizzle=128 rows of one "
                              "span, like a", guards=(Op.WGMMA,))
def _wgmma_b_major(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, b in _majored(ctx, "b_major", "k", "b"):
        if b.space is not MemSpace.SMEM:
            continue
        span, row = ctx.swizzle_of(n.arg("b").buf), ctx.static(b.shape[1])
        if span != 128 or row is None or row * b.dtype.bytes != span:
            yield ctx.diag("wgmma.b_major", n, f"b_major=\"k\" reads `{n.arg('b').buf}` {fmt_shape(ctx, b.shape)} "
                                               f"(swizzle={span}) as N rows of K: each row must be one 128-byte "
                                               "swizzle span", path=path,
                           hint=f"allocate b as smem({b.dtype.value}, (BN, {128 // b.dtype.bytes}), swizzle=128) and "
                                "split a wider K into several wgmma calls")


# ----------------------------------------------------------- fragment epilogues

def _epilogues(ctx: Ctx) -> Iterator[tuple[Node, str]]:
    for n, path, _ in ctx.nodes:
        if n.op is Op.ARGMIN_BIAS:
            yield n, path


def fragment_state_checks(ctx: Ctx, op: Op, rule_id: str, state: tuple[str, str], what: str,
                          smem_state: bool = False) -> Iterator[Diagnostic]:
    """A fused epilogue (argmin_bias, topk_bias) reads a wgmma accumulator of its own role and keeps its
    per-row ``state`` tiles (values, indices) in rmem tiles allocated in that role, or (``smem_state``) in
    one-stage smem tiles of the CTA."""
    accs: dict[str, Node | None] = {}
    for m, _, _ in ctx.nodes:
        if m.op in _ASYNC_MMAS:
            accs[m.arg("acc")] = ctx.role_of.get(id(m))
    for n, path, _ in ctx.nodes:
        if n.op is not op:
            continue
        role = ctx.role_of.get(id(n))
        dots = n.arg("dots")
        if role is None or dots not in accs or accs[dots] is not role:
            yield ctx.diag(rule_id, n, f"`{dots}` is not the accumulator of a wgmma in this role",
                           path=path, hint="pass the wgmma accumulator itself (after wgmma_wait), not a copy")
        for name in state:
            b = n.arg(name)
            t, at = ctx.buffers.get(b), ctx.defined_at.get(b)
            if smem_state and t is not None and t.space is MemSpace.SMEM and stages_of(ctx, b) == 1:
                continue
            if t is not None and (t.space is not MemSpace.RMEM or at is None or ctx.role_of.get(id(at)) is not role):
                yield ctx.diag(rule_id, n, f"{name} `{b}` must be an rmem tile allocated in the same role "
                                           f"({what})", path=path,
                               hint=f"allocate `{b}` with rmem(...) inside the role, before the loop")


def fragment_dtype_checks(ctx: Ctx, op: Op, rule_id: str, state: tuple[str, str],
                          bias_hint: str) -> Iterator[Diagnostic]:
    """A fused epilogue keeps f32 values and i32 indices, and reads an f32 accumulator and bias."""
    want = {state[0]: DType.F32, state[1]: DType.I32, "dots": DType.F32}
    for n, path, _ in ctx.nodes:
        if n.op is not op:
            continue
        for name, dt in want.items():
            t = ctx.buffers.get(n.arg(name))
            if t is not None and t.dtype is not dt:
                yield ctx.diag(rule_id, n, f"{name} `{n.arg(name)}` is {t.dtype.value}; {dt.value} needed",
                               path=path, hint=f"allocate it as {dt.value}")
        t = ctx.buffers.get(n.arg("bias").buf)
        if t is not None and t.dtype is not DType.F32:
            yield ctx.diag(rule_id, n, f"bias `{n.arg('bias').buf}` is {t.dtype.value}; f32 needed",
                           path=path, hint=bias_hint)


@rule("argmin_bias.acc", "wgmma", "argmin_bias reads a wgmma accumulator of its own role and keeps row state in rmem "
                                  "tiles of that role", guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_acc(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_state_checks(ctx, Op.ARGMIN_BIAS, "argmin_bias.acc", ("best", "arg"),
                                 "it is per-thread row state of the fragment")


@rule("argmin_bias.shape", "wgmma", "argmin_bias: dots (R, C), best and arg (R,) or (R, 1), bias C values",
      guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_shape(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path in _epilogues(ctx):
        dots, bias = ctx.buffers.get(n.arg("dots")), ctx.buffers.get(n.arg("bias").buf)
        if dots is None or dots.rank != 2:
            if dots is not None:
                yield ctx.diag("argmin_bias.shape", n, f"dots `{n.arg('dots')}` is {fmt_shape(ctx, dots.shape)}; "
                                                       "a 2-D accumulator (rows, candidates) is needed", path=path)
            continue
        rows, cols = ctx.static(dots.shape[0]), ctx.static(dots.shape[1])
        for name in ("best", "arg"):
            t = ctx.buffers.get(n.arg(name))
            if t is not None and [ctx.static(d) for d in t.shape] not in ([rows], [rows, 1]):
                yield ctx.diag("argmin_bias.shape", n, f"{name} `{n.arg(name)}` is {fmt_shape(ctx, t.shape)}; dots "
                                                       f"{fmt_shape(ctx, dots.shape)} needs ({rows},)", path=path,
                               hint="one running entry per row of the accumulator")
        if bias is not None and ctx.static_numel(bias.shape) != cols:
            yield ctx.diag("argmin_bias.shape", n, f"bias `{n.arg('bias').buf}` holds {ctx.static_numel(bias.shape)} "
                                                   f"values per slot; dots has {cols} columns", path=path,
                           hint=f"allocate the bias as smem(f32, ({cols},), stages=S)")


@rule("argmin_bias.dtype", "wgmma", "argmin_bias keeps f32 values and i32 indices and reads an f32 bias",
      guards=(Op.ARGMIN_BIAS,))
def _argmin_bias_dtype(ctx: Ctx) -> Iterable[Diagnostic]:
    return fragment_dtype_checks(ctx, Op.ARGMIN_BIAS, "argmin_bias.dtype", ("best", "arg"),
                                 "load the per-column values into an smem(f32, ...) tile")
