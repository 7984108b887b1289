"""Lowering hooks of the async ops (``dispatch.LOWERINGS`` names them), onto header/cake_async.cuh.

- ``role``: sibling roles become one ``if / else if`` chain over thread ranges (what setmaxnreg needs),
  each branch opening with ``setmaxnreg.inc`` (regs above the entry cap) or ``.dec``; the kernel then
  gets ``__launch_bounds__(threads, 1)``. When top-level code follows the roles (a cluster merge, a
  cluster_sync), each such branch ends by going back to the entry cap: that code runs on every thread and
  is compiled for the cap, so a warp left below it would read registers it no longer holds.
- ``mbarrier``: 8 bytes each in dynamic smem, initialised by thread 0, then ``__syncthreads()``.
  ``arrive``: one elected thread per warpgroup of the role; ``expect_tx``: the role's first thread;
  ``wait``: every thread spins on ``try_wait.parity``.
- ``tma_load`` / ``tma_store``: ``cp.async.bulk.tensor`` from the role's first thread, through a tensor
  map kernel argument (see :class:`TensorMapArg`; the host encodes it). Smem tiles with swizzle=128
  are placed at 1024-byte aligned offsets (lower_tile: the swizzle pattern is address-based).
- ``cp_async_bar``: every thread of the role copies its chunks of the window (cp.async of 16/8/4 bytes
  as the row alignment allows, into the slot's swizzle-128 layout), then cp.async.mbarrier.arrive on the
  barrier and a named barrier of the role (``cake::cp_async_bar_smem_gmem``).
- ``wgmma``: per warpgroup ``m64nNk16`` (bf16/f16 → f32), a K-major swizzle-128 A (64 rows per
  warpgroup) and an N-major swizzle-128 B (N = 64, 128, 192 or 256: N / 64 swizzle atoms side by side,
  stored as 64-column blocks that the descriptor's leading byte offset steps over; a tma_load into such
  a tile issues one box per block), shared-memory descriptors, one commit group; ``wgmma_wait(n)`` → ``wgmma.wait_group n``. The accumulator is an rmem tile in the
  m64nNk16 fragment layout (``N / 2`` floats per thread); ``store`` of it is lowered here.
- ``wgmma(..., b_major="k")``: b is an (N, 64) K-major swizzle-128 tile, described like a (rows of one
  128-byte span, 8-row groups 1024 B apart) with the instruction's transpose-b immediate 0.
  ``accumulate=False`` sets scale-d to 0 on the first k step (acc = a @ b).
- ``argmin_bias``: on the accumulator's fragment (``cake::argmin_bias_rmem_wgmma_acc``): each thread keeps
  (best, arg) for the 2 rows it owns per warpgroup (``float best[2]; int arg[2]``) over its own columns;
  ``store`` of either tile merges the 4 lanes of each quad (shuffles) and writes one value per row.
- ``topk_bias`` / ``sqnorm_rows``: see lower_topk.py (its lists' ``rmem`` and ``store`` are variants there).
- ``tcgen05_mma``: not lowered (``lower.unsupported_atom``) on any target yet.
Inside roles, only ``rmem`` accumulators of wgmma and ``store`` of them are lowered among the v1 tile
ops (the v1 helpers distribute tiles over all CTA threads): the others' in-role variants here refuse them
with ``lower.unsupported_in_role``. The wgmma variants of ``rmem`` and ``store`` (and the argmin_bias row
state's) are chosen in ``dispatch`` by the predicates below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cake_core.ir.ops import At, Node, Op, Slot, Tile, View
from cake_core.ir.program import walk
from cake_core.ir.types import DType, MemSpace, Swizzle, TileType
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, window


@dataclass(frozen=True)
class TensorMapArg:
    """One TMA tensor map the kernel takes as a ``const __grid_constant__ cake::tensor_map`` argument.

    The runtime encodes it with ``cuTensorMapEncodeTiled`` on the gmem parameter ``gmem``: data type
    ``dtype``, rank = the parameter's rank, global dims innermost first, global strides in bytes
    (each a multiple of 16), box dims ``box`` (given here in IR order, outermost first: reverse them for
    the driver), element strides 1, interleave none, swizzle ``swizzle`` bytes (0/32/64/128),
    L2 promotion any, and out-of-bounds fill NONE (zeros: the IR's semantics).
    """

    name: str
    gmem: str
    dtype: DType
    box: tuple[int, ...]
    swizzle: int


def async_state(ctx: Ctx) -> dict[str, Any]:
    """The async lowering's state on the context: the role being lowered, barriers, tensor maps, wgmma
    accumulators (``frag``) and argmin_bias row state, setmaxnreg and the cluster."""
    st = ctx.__dict__.get("async_state")
    if st is None:
        nodes = [w[0] for w in walk(ctx.program.body)]
        accs = {n.arg("acc") for n in nodes if n.op is Op.WGMMA}
        # fragment row state of argmin_bias: name -> (0 best / 1 arg, the partner tile)
        rowstate = {}
        for n in nodes:
            if n.op is Op.ARGMIN_BIAS:
                rowstate[n.arg("best")] = (0, n.arg("arg"))
                rowstate[n.arg("arg")] = (1, n.arg("best"))
        st = ctx.__dict__["async_state"] = {"role": None, "bars": {}, "maps": {}, "accs": accs, "frag": {},
                                            "rowstate": rowstate, "rows": {}, "setmaxnreg": False, "cluster": None}
    return st


def role_threads(ctx: Ctx) -> tuple[int, int]:
    """(first thread, threads) of the enclosing role, or the whole CTA."""
    r = async_state(ctx)["role"]
    return r if r is not None else (0, ctx.threads)


def named_barrier(ctx: Ctx, first: int) -> int:
    """The named barrier of the role whose first thread is ``first``: 1 + its first warpgroup (0 is
    __syncthreads')."""
    return 1 + first // ctx.arch.warpgroup_threads


def _first(ctx: Ctx) -> str:
    return f"threadIdx.x == {role_threads(ctx)[0]}"


def slot_ptr(ctx: Ctx, s: Slot, what: str) -> tuple[Buf, str]:
    b = ctx.buf(s.buf, (MemSpace.SMEM,), what)
    if s.index is None:
        return b, s.buf
    return b, f"({s.buf} + ({ctx.check_expr(s.index, 'a slot index')}) * {b.numel})"


def _bar_ptr(ctx: Ctx, s: Slot) -> str:
    if s.buf not in async_state(ctx)["bars"]:
        raise LowerError("lower.unknown_name", f"`{s.buf}` is not an mbarrier in scope",
                         "allocate it with mbarrier(S) at the kernel's top level, before the roles")
    return f"&{s.buf}[{ctx.check_expr(s.index, 'a barrier slot') if s.index is not None else 0}]"


# --------------------------------------------------------------------- roles

def lower_role(n: Node, ctx: Ctx) -> list[Line]:
    st = async_state(ctx)
    if st["role"] is not None or ctx.loop_vars:
        raise LowerError("lower.role_placement", "roles are lowered only at the kernel's top level")
    body = ctx.program.body
    i = next(k for k, m in enumerate(body) if m is n)
    chained = i > 0 and body[i - 1].op is Op.ROLE
    lo, hi = n.args[1]
    t0, t1 = lo * ctx.arch.warp_size, hi * ctx.arch.warp_size
    pad = "    " * ctx.depth
    cond = f"threadIdx.x >= {t0}u && threadIdx.x < {t1}u" if t0 else f"threadIdx.x < {t1}u"
    out: list[Line] = [(n.line, f"{pad}{'else if' if chained else 'if'} ({cond}) {{  // role {n.args[0]}")]
    regs = n.attr("regs")
    cap = ctx.arch.entry_regs(ctx.threads)
    if regs:
        st["setmaxnreg"] = True
        out.append((n.line, f"{pad}    cake::setmaxnreg_{'inc' if regs > cap else 'dec'}<{regs}>();"))
    st["role"] = (t0, t1 - t0)
    try:
        out += ctx.lower_nested(n.body)
    finally:
        st["role"] = None
    if regs and regs != cap and any(m.op is not Op.ROLE for m in body[i + 1:]):
        # every thread runs the top-level code after the roles, compiled for the entry cap: a role that
        # gave registers away takes them back (and one that took more returns them) before it
        out.append((n.line, f"{pad}    cake::setmaxnreg_{'dec' if regs > cap else 'inc'}<{cap}>();  "
                            "// back to the entry cap for the code after the roles"))
    return out + [(n.line, pad + "}")]


# ------------------------------------------------------------------ mbarriers

def lower_mbarrier(n: Node, ctx: Ctx) -> list[Line]:
    st = async_state(ctx)
    if st["role"] is not None or ctx.loop_vars:
        raise LowerError("lower.role_placement", "allocate mbarriers at the kernel's top level, before the roles")
    count = ctx.static(n.args[0], "the number of barriers")
    off = ctx.smem_region(n, f"mbarrier array `{n.result}`").offset
    st["bars"][n.result] = count
    return [f"uint64_t* const {n.result} = reinterpret_cast<uint64_t*>(cake_smem + {off});  // {count} mbarriers",
            f"if (threadIdx.x == 0) {{ for (int i = 0; i < {count}; ++i) cake::mbarrier_init(&{n.result}[i], "
            f"{n.attr('arrivals')}); cake::fence_mbarrier_init(); }}",
            "__syncthreads();"]


def lower_expect_tx(n: Node, ctx: Ctx) -> list[Line]:
    return [f"if ({_first(ctx)}) cake::mbarrier_arrive_expect_tx({_bar_ptr(ctx, n.arg('bar'))}, "
            f"{ctx.check_expr(n.arg('bytes'), 'the byte count')});"]


def lower_arrive(n: Node, ctx: Ctx) -> list[Line]:
    first, wg = role_threads(ctx)[0], ctx.arch.warpgroup_threads
    mc = n.attr("multicast")
    if mc:      # one remote arrival per warpgroup on each cluster CTA of the mask
        ranks = [r for r in range(ctx.arch.max_cluster_size) if mc >> r & 1]
        return [f"if ((threadIdx.x - {first}u) % {wg}u == 0u) {{  // one arrival per warpgroup on cluster CTAs "
                f"{ranks}"] + [f"    cake::mbarrier_arrive_cluster({_bar_ptr(ctx, n.arg('bar'))}, {r}u);"
                               for r in ranks] + ["}"]
    return [f"if ((threadIdx.x - {first}u) % {wg}u == 0u) cake::mbarrier_arrive({_bar_ptr(ctx, n.arg('bar'))});"
            "  // one arrival per warpgroup"]


def lower_wait(n: Node, ctx: Ctx) -> list[Line]:
    return [f"cake::mbarrier_wait_parity({_bar_ptr(ctx, n.arg('bar'))}, "
            f"{ctx.check_expr(n.arg('phase'), 'the phase')});"]


# ----------------------------------------------------------------------- TMA

def _tensor_map(ctx: Ctx, v: View, tile: Buf, split: int = 1, rows: int = 0) -> tuple[str, list[str]]:
    """The tensor map argument for a view (registered once per gmem, box, swizzle) and the
    coordinates, innermost first. ``split`` > 1: the box's innermost dimension is copied as ``split``
    column boxes (the map's box is that much narrower; the coordinates are those of the first).
    ``rows`` > 0: the box's outermost dimension is cut to ``rows`` (tma_load's rows=)."""
    g = ctx.buf(v.buf, (MemSpace.GMEM,), "the gmem tensor")
    if len(v.index) != len(g.type.shape) or len(v.index) > 5:
        raise LowerError("lower.unsupported_rank", f"TMA views of `{v.buf}` need one index per dimension, "
                                                   "rank at most 5")
    box, coords = [], []
    for ix, d in zip(v.index, g.type.shape):
        if isinstance(ix, Tile):
            size = ctx.static(ix.size, "a TMA box size")
            box.append(size)
            coords.append(f"({ctx.check_expr(ix.index, 'a tile index')}) * {size}")
        elif isinstance(ix, At):
            box.append(1)
            coords.append(ctx.check_expr(ix.index, "an index"))
        else:
            box.append(ctx.static(d, "a `:` dimension of a TMA box"))
            coords.append("0")
    if split > 1:
        if box[-1] % split:
            raise LowerError("lower.shape_mismatch", f"the TMA box {tuple(box)} of `{v.buf}` does not split into "
                                                     f"{split} column boxes")
        box[-1] //= split
    full = math.prod(box) * split
    if rows:       # the slot's first dimension: the box's first one not picked by a single index
        k = next((i for i, ix in enumerate(v.index) if not isinstance(ix, At)), None)
        if k is None or len(tile.shape) < 2 or rows >= box[k] or box[k] != tile.shape[0]:
            raise LowerError("lower.shape_mismatch", f"rows={rows} of the TMA box {tuple(box)} of `{v.buf}` into "
                                                     f"{tile.name} {tile.shape}: fewer rows than the slot's first "
                                                     "dimension, of a rank-2 or higher slot, are needed")
        box[k] = rows
    if full != tile.numel:
        raise LowerError("lower.shape_mismatch", f"the TMA box {tuple(box)} of `{v.buf}` does not fill the smem "
                                                 f"tile {tile.shape}")
    maps = async_state(ctx)["maps"]
    key = (v.buf, tuple(box), int(tile.type.swizzle))
    if key not in maps:
        maps[key] = TensorMapArg(f"cake_tmap_{v.buf}_{len(maps)}", v.buf, g.type.dtype, tuple(box),
                                 int(tile.type.swizzle))
    return maps[key].name, coords[::-1]


def _column_blocks(b: Buf) -> int:
    """How many swizzle-span-wide column blocks a swizzled smem tile is stored as (1: plain rows).

    A swizzled tile whose rows are wider than the swizzle span (a (64, 256) bf16 wgmma b with
    swizzle=128: 512-byte rows) is stored as row-major blocks of span-wide columns side by side:
    block j holds columns [j * w, (j + 1) * w), w = span / element bytes, as a (rows, w) swizzled tile at
    element offset j * rows * w. TMA fills it one block per box; wgmma's N-major descriptor steps from
    block to block with its leading byte offset."""
    span = int(b.type.swizzle)
    row_bytes = b.shape[-1] * b.type.dtype.bytes
    if not span or row_bytes <= span:
        return 1
    if row_bytes % span:
        raise LowerError("lower.unsupported_layout", f"smem tile {b.name} {b.shape} has {row_bytes}-byte rows: wider "
                                                     f"than its {span} B swizzle span and not a multiple of it")
    return row_bytes // span


def lower_tma_load(n: Node, ctx: Ctx) -> list[Line]:
    b, ptr = slot_ptr(ctx, n.arg("dst"), "TMA destination")
    split = _column_blocks(b)
    tmap, coords = _tensor_map(ctx, n.arg("src"), b, split, n.attr("rows"))
    bar = _bar_ptr(ctx, n.arg("bar"))
    mc = n.attr("multicast")
    out = []
    for j in range(split):      # one box per swizzle-span column block (split == 1: the whole tile)
        dst = ptr if split == 1 else f"{ptr} + {j * b.numel // split}"
        cs = list(coords)
        if j:
            cs[0] = f"{cs[0]} + {j * b.shape[-1] // split}"
        if mc:
            out.append(f"if ({_first(ctx)}) cake::tma_load_{len(cs)}d_multicast({dst}, &{tmap}, {bar}, "
                       f"(uint16_t){mc}, {', '.join(cs)});")
        else:
            out.append(f"if ({_first(ctx)}) cake::tma_load_{len(cs)}d({dst}, &{tmap}, {bar}, {', '.join(cs)});")
    return out


def lower_tma_store(n: Node, ctx: Ctx) -> list[Line]:
    b, ptr = slot_ptr(ctx, n.arg("src"), "TMA source")
    if _column_blocks(b) > 1:
        raise LowerError("lower.unsupported_layout", f"tma_store from {b.name} {b.shape}: rows wider than the "
                                                     "swizzle span are lowered for tma_load into wgmma's b only")
    tmap, coords = _tensor_map(ctx, n.arg("dst"), b)
    return [f"if ({_first(ctx)}) cake::tma_store_{len(coords)}d(&{tmap}, {ptr}, {', '.join(coords)});"]


def lower_cp_async(n: Node, ctx: Ctx) -> list[Line]:
    b, ptr = slot_ptr(ctx, n.arg("dst"), "cp.async destination")
    if _column_blocks(b) > 1:
        raise LowerError("lower.unsupported_layout", f"cp_async into {b.name} {b.shape}: rows wider than the "
                                                     "swizzle span are lowered for tma_load into wgmma's b only")
    w = window(n.arg("src"), b.shape, ctx, "source")
    first, count = role_threads(ctx)
    return [f"cake::cp_async_smem_gmem<{w.rows}, {w.cols}, {count}>({ptr}, {w.base}, {w.ld_row}, {w.ld_col}, "
            f"{w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first});"]


def lower_cp_async_bar(n: Node, ctx: Ctx) -> list[Line]:
    if async_state(ctx)["role"] is None:
        raise LowerError("lower.role_placement", "cp_async_bar is lowered inside a role (it ends with a named "
                                                 "barrier of the role's threads)")
    b, ptr = slot_ptr(ctx, n.arg("dst"), "cp.async destination")
    swz = int(b.type.swizzle)
    if swz and (swz != 128 or b.shape[-1] * b.type.dtype.bytes != 128):
        raise LowerError("lower.unsupported_layout", f"cp_async_bar into {b.name} {b.shape} with swizzle={swz}: "
                                                     "swizzled slots are lowered with rows of one 128-byte span")
    w = window(n.arg("src"), b.shape, ctx, "source")
    first, count = role_threads(ctx)
    bar_id = named_barrier(ctx, first)
    return [f"cake::cp_async_bar_smem_gmem<{w.rows}, {w.cols}, {'true' if swz else 'false'}, {count}, {bar_id}>("
            f"{ptr}, {w.base}, {w.ld_row}, {w.ld_col}, {w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first}, "
            f"{_bar_ptr(ctx, n.arg('bar'))});"]


def lower_cp_async_wait(n: Node, ctx: Ctx) -> list[Line]:
    return [f"cake::cp_async_wait<{ctx.static(n.args[0], 'the groups left in flight') if n.args[0] else 0}>();"]


def lower_fence(n: Node, ctx: Ctx) -> list[Line]:
    return ["cake::fence_async();"]


def lower_cluster(n: Node, ctx: Ctx) -> list[Line]:
    dims = [ctx.static(d, "a cluster dimension") for d in n.args[0]]
    async_state(ctx)["cluster"] = tuple(dims + [1] * (3 - len(dims)))
    return [f"// cluster {tuple(dims)}: __cluster_dims__ on the kernel"]


def lower_cluster_sync(n: Node, ctx: Ctx) -> list[Line]:
    return ["cake::cluster_sync();"]


# --------------------------------------------------------------------- wgmma

def _wgmma_asm(n_cols: int, ab: str, scale_d: str = '"n"(1)', tnsp_b: int = 1) -> str:
    """The wgmma asm statement; ``scale_d`` is the operand of its scale-d predicate (0: D = A @ B);
    ``tnsp_b`` the transpose-b immediate (1: b is N-major, 0: K-major)."""
    regs = n_cols // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(ACC[{i}])' for i in range(regs))
    return (f'asm volatile("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{regs + 2}, 0;\\n\\t'
            f'wgmma.mma_async.sync.aligned.m64n{n_cols}k16.f32.{ab}.{ab} {{{d}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, {tnsp_b};'
            f'\\n\\t}}" : {outs} : "l"(cake_da), "l"(cake_db), {scale_d});')


def lower_wgmma(n: Node, ctx: Ctx) -> list[Line]:
    rows = _wgmma_rows(ctx)
    acc_n = n.arg("acc")
    frag = async_state(ctx)["frag"].get(acc_n)
    if frag is None:
        raise LowerError("lower.unsupported_operand", f"`{acc_n}` is not a wgmma accumulator in scope")
    a, pa = slot_ptr(ctx, n.arg("a"), "operand a")
    b, pb = slot_ptr(ctx, n.arg("b"), "operand b")
    kmajor = n.attr("b_major") == "k"
    (m, k), (bk, nn) = a.shape, (b.shape[::-1] if kmajor else b.shape)
    dt = a.type.dtype
    if dt not in (DType.BF16, DType.F16) or b.type.dtype is not dt:
        raise LowerError("lower.unsupported_operand", "wgmma is lowered for bf16/f16 operands")
    if kmajor and (b.type.swizzle != Swizzle.B128 or bk * 2 != 128 or nn % 8):
        raise LowerError("lower.unsupported_layout", "a K-major wgmma b (b_major=\"k\") is lowered as an (N, 64) "
                                                     "16-bit tile with swizzle=128 (one 128-byte span per row), "
                                                     "N a multiple of 8", "allocate b as smem(bf16, (BN, 64), "
                                                                          "swizzle=128)")
    if a.type.swizzle != Swizzle.B128 or b.type.swizzle != Swizzle.B128 or k * 2 != 128 or (nn * 2 % 128
                                                                                             and not kmajor):
        raise LowerError("lower.unsupported_layout", "wgmma is lowered for swizzle=128 operands: a's rows one "
                                                     "128-byte swizzle span (BK = 64 for 16-bit types), b's rows a "
                                                     "whole number of spans (BN = 64, 128, 192 or 256)",
                         "allocate a (BM, 64) and b (64, BN) with swizzle=128")
    if (m, nn) != frag[:2] or bk != k or k % 16:
        raise LowerError("lower.shape_mismatch", f"wgmma shapes: acc {frag[:2]}, a {a.shape}, b {b.shape}")
    first = role_threads(ctx)[0]
    ab = "bf16" if dt is DType.BF16 else "f16"
    fresh = frag[2] if len(frag) > 2 else None
    if not n.attr("accumulate"):
        scale_d = '"r"((int)(cake_k > 0))'          # acc = a @ b: the first k step drops acc's old value
    else:
        scale_d = f'"r"((int)(cake_k > 0 || !{fresh}))' if fresh else '"n"(1)'
    asm = _wgmma_asm(nn, ab, scale_d, 0 if kmajor else 1).replace("ACC", acc_n)
    if kmajor:      # like a: rows of 64 K-elements in one 128-byte span, 8-row groups 1024 B apart
        db = (f"        const uint64_t cake_db = cake::wgmma_desc(cake_b + cake_k * 16, 16, 1024, 1);"
              f"  // K-major, 128B: {nn} rows of 64")
    else:
        db = (f"        const uint64_t cake_db = cake::wgmma_desc(cake_b + cake_k * {16 * 64}, {bk * 128}, 1024, 1);"
              f"  // N-major, 128B: {nn // 64} column block(s) {bk * 128} B apart (LBO), 8-row groups 1024 B apart "
              "(SBO)")
    return [
        "{",
        "    cake::wgmma_fence();",
        f"    const int cake_wg = ((int)threadIdx.x - {first}) / {ctx.arch.warpgroup_threads};",
        f"    const {dt.c_type}* const cake_a = {pa} + cake_wg * {rows * k};  // {rows} rows per warpgroup",
        f"    const {dt.c_type}* const cake_b = {pb};",
        "#pragma unroll",
        f"    for (int cake_k = 0; cake_k < {k // 16}; ++cake_k) {{",
        "        const uint64_t cake_da = cake::wgmma_desc(cake_a + cake_k * 16, 16, 1024, 1);  // K-major, 128B",
        db,
        f"        {asm}",
        "    }",
        "    cake::wgmma_commit();",
        *([f"    {fresh} = 0;"] if fresh else []),
        "}",
    ]


def lower_wgmma_wait(n: Node, ctx: Ctx) -> list[Line]:
    return [f"cake::wgmma_wait<{ctx.static(n.args[0], 'the groups left in flight') if n.args[0] else 0}>();"]


def lower_tcgen05(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_atom", "tcgen05_mma is declared (sm_100a) but not lowered yet: tensor "
                                               "memory allocation and tcgen05.mma are missing from the header",
                     "use wgmma on sm_90a")


# -------------------------------- variants of the v1 tile ops: wgmma accumulators, row state, in-role refusals

def in_role(n: Node, ctx: Ctx) -> bool:
    """The node is lowered inside a warp role."""
    return async_state(ctx)["role"] is not None


def is_rowstate(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation, inside a role, of argmin_bias row state (best / arg)."""
    return n.result in async_state(ctx)["rowstate"] and in_role(n, ctx)


def is_wgmma_acc(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation of a wgmma accumulator."""
    return n.result in async_state(ctx)["accs"]


def stores_rowstate(n: Node, ctx: Ctx) -> bool:
    """A store of argmin_bias row state allocated in a role."""
    return n.arg("src") in async_state(ctx)["rows"]


def reads_wgmma_acc(n: Node, ctx: Ctx) -> bool:
    """A store or an atomic_add of a wgmma accumulator in scope."""
    return n.arg("src") in async_state(ctx)["frag"]


def lower_acc_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """A wgmma accumulator: the m64nN fragment of each warpgroup, N / 2 floats per thread."""
    st = async_state(ctx)
    dtype, shape = n.args
    m, nn = (ctx.static(d, "an rmem shape") for d in shape)
    first, count = role_threads(ctx)
    rows, wg = _wgmma_rows(ctx), ctx.arch.warpgroup_threads
    if dtype is not DType.F32 or m != rows * (count // wg) or count % wg:
        raise LowerError("lower.shape_mismatch", f"wgmma accumulator `{n.result}` is {dtype.value} {(m, nn)} over "
                                                 f"{count} threads; f32 with {rows} rows per warpgroup needed")
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), (m, nn))
    st["frag"][n.result] = (m, nn)
    fill = n.attr("fill")
    decl = f"float {n.result}[{nn // 2}];  // wgmma accumulator ({m}, {nn}): m64n{nn} fragment per warpgroup"
    if float(fill) == 0.0:
        # zero lazily: the first wgmma into it runs with scale-d = 0 (D = A @ B), and a store that no wgmma
        # preceded zero-fills then. Zero-filling up front would put ordinary writes of the accumulator in
        # front of a wgmma pipeline that spans loop trips (wgmma_wait(1)), and ptxas then serialises
        # every wgmma (C7515).
        st["frag"][n.result] = (m, nn, _fresh(n.result))
        return [decl, f"int {_fresh(n.result)} = 1;  // {n.result} is all zeros until a wgmma writes it"]
    return [decl, f"cake::fill_rmem({n.result}, {float(fill)!r}f);"]


def _wgmma_rows(ctx: Ctx) -> int:
    """Accumulator rows per warpgroup (wgmma's M)."""
    if ctx.arch.wgmma is None:
        raise LowerError("lower.unsupported_atom", f"wgmma exists on sm_90a only, not {ctx.program.target}")
    return ctx.arch.wgmma.m


def fragment_rows(ctx: Ctx, threads: int) -> int:
    """The accumulator rows the whole warpgroups of ``threads`` threads hold (wgmma's M per warpgroup)."""
    return _wgmma_rows(ctx) * (threads // ctx.arch.warpgroup_threads)


def _fresh(acc: str) -> str:
    return f"cake_{acc}_fresh"


def lower_rowstate_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """best / arg of argmin_bias: 2 slots per thread, the fragment rows it owns (see cake_async.cuh)."""
    st = async_state(ctx)
    dtype, shape = n.args
    dims = [ctx.static(d, "an rmem shape") for d in shape]
    first, count = role_threads(ctx)
    which = st["rowstate"][n.result][0]
    rows, wg = _wgmma_rows(ctx), ctx.arch.warpgroup_threads
    if count % wg or dims not in ([rows * (count // wg)], [rows * (count // wg), 1]) or \
            dtype is not (DType.I32 if which else DType.F32):
        raise LowerError("lower.shape_mismatch", f"argmin_bias row state `{n.result}` is {dtype.value} {tuple(dims)} "
                                                 f"over {count} threads; ({rows * (count // wg)},) "
                                                 f"{'i32' if which else 'f32'} ({rows} rows per warpgroup) needed")
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), tuple(dims))
    st["rows"][n.result] = dims[0]
    c = dtype.c_type
    fill = n.attr("fill")
    lit = "__int_as_float(0x7f800000)" if math.isinf(fill) and fill > 0 else \
        "__int_as_float(0xff800000)" if math.isinf(fill) else (f"{float(fill)!r}f" if not which else str(int(fill)))
    return [f"{c} {n.result}[2];  // argmin_bias row state: this thread's 2 fragment rows (a partial of its quad)",
            f"cake::fill_rmem({n.result}, {lit});"]


def epilogue_operands(n: Node, ctx: Ctx) -> tuple[str, tuple, str]:
    """(dots, its wgmma fragment, the bias pointer) of a fused epilogue on a wgmma accumulator
    (argmin_bias, topk_bias): inside a role, dots an accumulator in scope, bias C f32 values in smem."""
    st = async_state(ctx)
    if st["role"] is None:
        raise LowerError("lower.unsupported_operand", f"{n.op.value} is lowered inside a role, on a wgmma accumulator")
    dots = n.arg("dots")
    frag = st["frag"].get(dots)
    if frag is None:
        raise LowerError("lower.unsupported_operand", f"`{dots}` is not a wgmma accumulator in scope")
    bias, pb = slot_ptr(ctx, n.arg("bias"), "bias")
    if bias.type.dtype is not DType.F32 or bias.numel != frag[1]:
        raise LowerError("lower.shape_mismatch", f"bias {bias.shape} {bias.type.dtype.value}: {frag[1]} f32 values "
                                                 "needed")
    return dots, frag, pb


def lower_argmin_bias(n: Node, ctx: Ctx) -> list[Line]:
    dots, frag, pb = epilogue_operands(n, ctx)
    for x in (n.arg("best"), n.arg("arg")):
        if x not in async_state(ctx)["rows"]:
            raise LowerError("lower.unsupported_operand", f"`{x}` is not argmin_bias row state allocated in this role")
    first = role_threads(ctx)[0]
    beta = float(n.attr("beta"))
    return [f"cake::argmin_bias_rmem_wgmma_acc<{frag[1]}>({n.arg('best')}, {n.arg('arg')}, {dots}, {pb}, "
            f"{beta!r}f, {ctx.check_expr(n.arg('base'), 'base')}, {ctx.check_expr(n.arg('limit'), 'limit')}, "
            f"(int)threadIdx.x - {first});"]


def lower_store_rowstate(n: Node, ctx: Ctx) -> list[Line]:
    st = async_state(ctx)
    view, src = n.args
    which, partner = st["rowstate"][src]
    best, arg = (src, partner) if which == 0 else (partner, src)
    if partner not in st["rows"]:
        raise LowerError("lower.unsupported_operand", f"`{partner}`, the partner of `{src}`, is not in scope")
    rows = st["rows"][src]
    w = window(view, (rows,), ctx, "destination")
    if w.rows != 1 or w.cols != rows:
        raise LowerError("lower.shape_mismatch", f"argmin_bias row state `{src}` ({rows},) stores into a 1-D window "
                                                 f"of {rows}, not {w.rows} x {w.cols}")
    n_in = f"(({w.rows_in}) > 0 ? (int)({w.cols_in}) : 0)" if n.attr("guard") else str(rows)
    first = role_threads(ctx)[0]
    return [f"cake::store_gmem_rowstate<{which}>({w.base}, {best}, {arg}, {w.ld_col}, {n_in}, "
            f"(int)threadIdx.x - {first});  // merges each row's quad"]


def lower_store_acc(n: Node, ctx: Ctx) -> list[Line]:
    """A store of a wgmma accumulator from its fragments (zeros when no wgmma wrote it)."""
    view, src = n.args
    frag = async_state(ctx)["frag"][src]
    w = window(view, frag[:2], ctx, "destination")
    guard = "true" if n.attr("guard") else "false"
    first = role_threads(ctx)[0]
    return zero_unwritten_acc(ctx, src) + [
        f"cake::store_gmem_wgmma_acc<{frag[1]}, {guard}>({w.base}, {src}, {w.ld_row}, {w.ld_col}, "
        f"{w.rows_in}, {w.cols_in}, (int)threadIdx.x - {first});"]


def zero_unwritten_acc(ctx: Ctx, acc: str) -> list[str]:
    """The line that zero-fills a lazily zeroed accumulator no wgmma wrote (none for one filled up front)."""
    frag = async_state(ctx)["frag"][acc]
    return [f"if ({frag[2]}) cake::fill_rmem({acc}, 0.0f);  // no wgmma wrote it"] if len(frag) > 2 else []


def refuse_rmem_in_role(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_in_role", f"rmem tile `{n.result}` inside a role: v1 lowers rmem "
                                                  "inside roles only as a wgmma accumulator")


def refuse_store_in_role(n: Node, ctx: Ctx) -> list[Line]:
    raise LowerError("lower.unsupported_in_role", "store inside a role: v1 lowers it only for a wgmma "
                                                  "accumulator")


def refuse_cta_op_in_role(n: Node, ctx: Ctx) -> list[Line]:
    """``load``, ``mma``: the v1 helpers spread them over all the CTA's threads."""
    raise LowerError("lower.unsupported_in_role", f"`{n.op.value}` inside a role: the v1 helper spreads it over "
                                                  "all CTA threads", "use tma_load/cp_async and wgmma in roles")


# --------------------------------------------------------------------- kernel

def kernel_extras(ctx: Ctx) -> tuple[list[str], str, tuple[TensorMapArg, ...], tuple[int, ...]]:
    """What the kernel declaration gains: tensor-map parameters, the launch-bounds minimum and cluster."""
    st = ctx.__dict__.get("async_state")
    if st is None:
        return [], "", (), ()
    maps = tuple(st["maps"].values())
    params = [f"const __grid_constant__ cake::tensor_map {m.name}" for m in maps]
    attrs = ""
    if st["cluster"]:
        attrs = "__cluster_dims__({}, {}, {}) ".format(*st["cluster"])
    return params, attrs, maps, st["cluster"] or ()


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.ROLE: lower_role,
    Op.CLUSTER: lower_cluster,
    Op.MBARRIER: lower_mbarrier,
    Op.EXPECT_TX: lower_expect_tx,
    Op.ARRIVE: lower_arrive,
    Op.WAIT: lower_wait,
    Op.TMA_LOAD: lower_tma_load,
    Op.TMA_STORE: lower_tma_store,
    Op.CP_ASYNC: lower_cp_async,
    Op.CP_ASYNC_BAR: lower_cp_async_bar,
    Op.CP_ASYNC_WAIT: lower_cp_async_wait,
    Op.FENCE_ASYNC: lower_fence,
    Op.CLUSTER_SYNC: lower_cluster_sync,
    Op.WGMMA: lower_wgmma,
    Op.WGMMA_WAIT: lower_wgmma_wait,
    Op.TCGEN05_MMA: lower_tcgen05,
    Op.ARGMIN_BIAS: lower_argmin_bias,
}
