"""Which elements of an elementwise op each thread touches: the loops of fill, cast, unary, ewise, select, iota.

One of these maps, chosen by where the op runs and which tiles it names (:func:`thread_map`):

- ``cta``, outside roles: element e = s * THREADS + threadIdx.x, slot s of an rmem tile (the IR's default
  distribution, ``lower_tile``) and element e of an smem tile;
- ``mma``, outside roles, where an rmem operand is in the mma_sync fragment layout (``lower_tile``): slot s of the
  thread's fragments, at the (row, column) ``cake::mma_layout::coord`` gives (where mma.sync put it); every rmem
  operand in that layout and of the destination's shape, read at its own slot; an smem operand read or written at
  that (row, column), a broadcast one at its row or column (``lower_tile.layout_guard`` admits no other rmem);
- ``role``, inside a role, smem tiles only: e = s * T + t, with t = threadIdx.x - first the thread's rank in the
  role and T the role's threads, so the role's threads cover the whole tile between them (the CTA map there
  would skip the elements of the other roles' threads);
- ``fragment``, inside a role, with fragments the role holds (its wgmma accumulators and the other tiles of
  ``ir.fragments``): slot s of thread t's m64nNk16 fragment, at row (t / 128) * 64 + (t % 128 / 32) * 16 +
  (t % 32) / 4 + (s % 4 / 2) * 8 and column (s / 4) * 8 + (t % 4) * 2 + s % 2, where
  ``cake::store_gmem_wgmma_acc`` stores that slot; an smem operand is read or written at that (row, column), a
  broadcast one at its row or column, and a row vector of the role at its row (its element cake_h = s % 4 / 2);
- ``rows``, inside a role, on row vectors of the role only (and smem read at the row): element s = cake_h of
  the 2 the thread holds, rows (t / 128) * 64 + (t % 128 / 32) * 16 + (t % 32) / 4 + s * 8; the 4 threads of a
  quad compute the same values.

Any other tile inside a role has no map (``lower.unsupported_in_role``; the verifier's ``role.compute`` refuses
it first): an rmem tile spread over the CTA's threads (the role holds only its own threads' slots), a
fragment broadcast to another shape, or an rmem operand that must be staged (CTA barriers).

The index expressions are C over ``cake_s`` and ``cake_t`` whose operands are never negative, so they read the
same as Python integer arithmetic with ``/`` as ``//``; in a role the emitted loop states all of them
(``cake_e``, ``cake_r``, ``cake_c``), and tests/lower/test_lower_role_compute.py evaluates them for every
thread to check that each element is touched exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass

from cake_core.ir.ops import Node
from cake_core.ir.types import MemSpace
from cake_core.lower.context import Buf, Ctx, LowerError
from cake_core.lower.lower_async import async_state, in_role, role_threads


@dataclass(frozen=True)
class ThreadMap:
    """How the threads running an elementwise op split its iteration space (the destination's elements)."""

    kind: str           # "cta", "role", "fragment" or "rows" (see the module docstring)
    first: int          # the first thread running it
    threads: int        # how many run it
    numel: int          # elements of the iteration space
    cols: int           # its last dimension
    wg_rows: int = 64   # fragment: accumulator rows per warpgroup (wgmma's M)
    wg_threads: int = 128
    mma_grid: tuple[int, int, int] | None = None   # mma: the fragment tiles' (rows, WM, WN)

    @property
    def slots(self) -> int:
        """Loop trips per thread."""
        if self.kind == "fragment":
            return self.cols // 2
        if self.kind == "rows":
            return 2
        return -(-self.numel // self.threads)      # mma: numel is a multiple of the threads (mma_layout)

    @property
    def elem(self) -> str:
        """C expression of the element index e (row-major) of trip ``cake_s``."""
        if self.kind == "cta":
            return "cake_s * THREADS + (int)threadIdx.x"
        if self.kind == "role":
            return f"cake_s * {self.threads} + cake_t"
        return f"cake_r * {self.cols} + cake_c"

    @property
    def half(self) -> str:
        """C expression of the row half cake_h of trip ``cake_s`` (fragment and rows maps): which of the
        thread's 2 rows, the element of a row vector."""
        return "cake_s % 4 / 2" if self.kind == "fragment" else "cake_s"

    @property
    def row(self) -> str:
        if self.kind not in ("fragment", "rows"):
            return f"cake_e / {self.cols}"
        w = self.wg_threads
        return f"(cake_t / {w}) * {self.wg_rows} + (cake_t % {w} / 32) * 16 + (cake_t % 32) / 4 + cake_h * 8"

    @property
    def col(self) -> str:
        if self.kind == "rows":
            return "0"
        if self.kind != "fragment":
            return f"cake_e % {self.cols}"
        return "(cake_s / 4) * 8 + (cake_t % 4) * 2 + cake_s % 2"

    @property
    def guard(self) -> str | None:
        """C condition for a trip past the last element (None: every trip is in range)."""
        if self.kind in ("fragment", "rows", "mma") or self.numel % self.threads == 0:
            return None
        return f"cake_e < {self.numel}"


def thread_map(ctx: Ctx, n: Node, dst: Buf, tiles: list[Buf]) -> ThreadMap:
    """The map of elementwise op ``n`` writing ``dst`` (``tiles``: every tile it names, dst included)."""
    numel, cols = dst.numel, dst.shape[-1]
    if not in_role(n, ctx):
        frag = [b for b in tiles if b.type.space is MemSpace.RMEM and b.layout is not None]
        if not frag:
            return ThreadMap("cta", 0, ctx.threads, numel, cols)
        f = frag[0]      # every rmem operand shares its layout and shape: lower_tile.layout_guard ran first
        if tuple(dst.shape) != tuple(f.shape) or len(f.shape) != 2:
            raise LowerError("lower.acc_layout", f"`{n.op.value}` writes `{dst.name}` {dst.shape} from mma_sync "
                                                 f"fragment `{f.name}` {f.shape}: its elements would move between "
                                                 "threads", "write a tile of the fragment's shape")
        return ThreadMap("mma", 0, ctx.threads, numel, cols, mma_grid=(f.shape[0], *f.layout))
    first, count = role_threads(ctx)
    rmem = [b for b in tiles if b.type.space is MemSpace.RMEM]
    if not rmem:
        return ThreadMap("role", first, count, numel, cols)
    for b in rmem:
        if not b.wgmma and not b.rowvec:
            raise LowerError("lower.unsupported_in_role",
                             f"`{n.op.value}` inside a role names rmem tile `{b.name}`, which is spread over all "
                             "the CTA's threads: the role's threads hold only their own slots of it",
                             "inside a role, compute on smem tiles and on the fragments and row vectors the role "
                             "holds (ir.fragments)")
        if b.wgmma and b.shape != dst.shape:
            raise LowerError("lower.unsupported_in_role",
                             f"`{n.op.value}` broadcasts fragment `{b.name}` {b.shape} to {dst.shape}: its "
                             "elements would move between threads", "give every fragment operand dst's shape")
    w = ctx.arch.wgmma
    kind = "fragment" if any(b.wgmma for b in rmem) else "rows"
    if kind == "rows" and not dst.rowvec:
        raise LowerError("lower.unsupported_in_role", f"`{n.op.value}` writes `{dst.name}` from row vectors: each "
                                                      "row's 4 threads would write it", "write a row vector of the role")
    return ThreadMap(kind, first, count, numel, cols, w.m if w else 64, ctx.arch.warpgroup_threads)


def owned_loop(tm: ThreadMap, body: list[str], unroll: int = 0) -> list[str]:
    """The loop over the elements ``tm`` gives this thread; ``body`` sees cake_s, cake_e, cake_r and cake_c.
    Unrolled fully (register tiles are indexed by cake_s), or ``unroll`` trips at a time where the body only
    touches smem and gmem, so that a long loop does not hold every trip's values in registers at once."""
    text = "\n".join(body)
    if tm.kind == "cta":
        index = [f"    [[maybe_unused]] const int cake_e = {tm.elem};"]
        inner = [f"    [[maybe_unused]] const int cake_r = {tm.row}, cake_c = {tm.col};"] \
            if "cake_r" in text or "cake_c" in text else []
    elif tm.kind == "role":
        index = [f"    [[maybe_unused]] const int cake_e = {tm.elem};"]
        inner = [f"    [[maybe_unused]] const int cake_r = {tm.row}, cake_c = {tm.col};"]
    elif tm.kind == "mma":
        rows, wm, wn = tm.mma_grid
        index = ["    int cake_r, cake_c;",
                 f"    cake::mma_layout<{rows}, {tm.cols}, THREADS, {wm}, {wn}>::coord(cake_s, cake_r, cake_c);",
                 f"    [[maybe_unused]] const int cake_e = {tm.elem};"]
        inner = []
    else:
        index = [f"    [[maybe_unused]] const int cake_h = {tm.half};",
                 f"    [[maybe_unused]] const int cake_r = {tm.row}, cake_c = {tm.col};",
                 f"    [[maybe_unused]] const int cake_e = {tm.elem};"]
        inner = []
    inner += ["    " + b for b in body]
    if tm.guard:
        inner = [f"    if ({tm.guard}) {{"] + ["    " + x for x in inner] + ["    }"]
    pre = [f"const int cake_t = (int)threadIdx.x - {tm.first};  // rank in the role"] \
        if tm.kind not in ("cta", "mma") else []
    return pre + ["#pragma unroll" + (f" {unroll}" if unroll else ""),
                  f"for (int cake_s = 0; cake_s < {tm.slots}; ++cake_s) {{"] + index + inner + ["}"]


def settle_fresh_accs(ctx: Ctx, tiles: list[Buf]) -> list[str]:
    """Lines that give a lazily zeroed accumulator (``lower_wgmma``: zero until a wgmma writes it) its zeros
    before an elementwise op reads or writes its registers, and mark it written, so that a later wgmma adds
    to what the op left instead of starting from zero."""
    frag = async_state(ctx)["frag"]
    out = []
    for name in dict.fromkeys(b.name for b in tiles if b.wgmma):
        f = frag.get(name)
        if f is not None and len(f) > 2:
            out.append(f"if ({f[2]}) {{ cake::fill_rmem({name}, 0.0f); {f[2]} = 0; }}  // zeros no wgmma wrote")
    return out
