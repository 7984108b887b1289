"""Lowering hooks of roles, mbarriers, async copies and clusters (``dispatch.LOWERINGS``), onto cake_async.cuh.

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
- ``wgmma``, ``wgmma_wait``, ``argmin_bias``, ``tcgen05_mma`` and the wgmma accumulators: see
  lower_wgmma.py; ``topk_bias`` / ``sqnorm_rows``: see lower_topk.py.
Inside roles, only ``rmem`` accumulators of wgmma and ``store`` of them are lowered among the v1 tile
ops (the v1 helpers distribute tiles over all CTA threads): the others' in-role variants here refuse them
with ``lower.unsupported_in_role``. The elementwise compute ops run there over the role's own threads
(``thread_map``); the other compute ops are refused the same way. The role's state (:func:`async_state`: the role being lowered, its
barriers, tensor maps and accumulators) is kept here for every async lowering module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cake_core.ir.fragments import layouts_on
from cake_core.ir.ops import At, Node, Op, Slot, Tile, View
from cake_core.ir.program import walk
from cake_core.ir.printer import fmt_view
from cake_core.ir.types import DType, MemSpace
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
    accumulators (``frag``) and argmin_bias row state, setmaxnreg, the cluster, and the layouts of the tiles the
    roles hold in the wgmma layout (``layouts``, ``ir.fragments``)."""
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
        layouts = layouts_on(ctx.program, ctx.arch)
        st = ctx.__dict__["async_state"] = {"role": None, "bars": {}, "maps": {}, "accs": accs, "frag": {},
                                            "rowstate": rowstate, "rows": {}, "setmaxnreg": False, "cluster": None,
                                            "layouts": layouts}
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
            if ix.offset:
                raise LowerError("lower.tma_window", f"a TMA copy of `{v.buf}` at {fmt_view(v)}: its boxes start at "
                                                     "multiples of their size and stop at the tensor's edge only",
                                 "copy a window with base= or limit= with load() or cp_async()")
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


def lower_role_sync(n: Node, ctx: Ctx) -> list[Line]:
    """bar.sync on the role's named barrier, over its threads (``named_barrier``)."""
    if async_state(ctx)["role"] is None:
        raise LowerError("lower.role_placement", "role_sync() is a barrier of one role's threads; at the top level "
                                                 "the CTA's barrier is sync()", "use sync() outside the roles")
    first, count = role_threads(ctx)
    return [f'asm volatile("bar.sync %0, %1;" :: "n"({named_barrier(ctx, first)}), "n"({count}) : "memory");'
            "  // the role's threads"]


def lower_fence(n: Node, ctx: Ctx) -> list[Line]:
    return ["cake::fence_async();"]


def lower_cluster(n: Node, ctx: Ctx) -> list[Line]:
    dims = [ctx.static(d, "a cluster dimension") for d in n.args[0]]
    async_state(ctx)["cluster"] = tuple(dims + [1] * (3 - len(dims)))
    return [f"// cluster {tuple(dims)}: __cluster_dims__ on the kernel"]


def lower_cluster_sync(n: Node, ctx: Ctx) -> list[Line]:
    return ["cake::cluster_sync();"]


# -------------------------------------------------------- in-role refusals of the v1 tile ops

def in_role(n: Node, ctx: Ctx) -> bool:
    """The node is lowered inside a warp role."""
    return async_state(ctx)["role"] is not None


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
    Op.ROLE_SYNC: lower_role_sync,
    Op.CLUSTER_SYNC: lower_cluster_sync,
}
