"""Recognising a CTA-collective contraction mainloop, the shape the structural tactics start from.

The naive seeds of a GEMM, an argmin-epilogue and a top-k-epilogue contraction share one structure: tiles of two
operands are loaded into shared memory on every trip of a reduction loop and multiplied into an rmem
accumulator by ``mma``; optionally an outer loop streams tiles of candidates (centroids, database rows)
past a fixed tile of rows, with an epilogue per candidate tile (scores from a bias and the dot products,
a running arg-min or top-k); at the end, stores::

    [allocations]
    for kt in range(cdiv(K, BK)):               # outer: optional
        fill(dot)                                # prologue: fills of the accumulators
        for dt in range(cdiv(D, BD)):            # reduction
            load(x_s, x[bid.y, tile(bid.x, BN), tile(dt, BD)])
            load(c_s, c[bid.y, tile(kt, BK), tile(dt, BD)])
            sync()
            transpose(ct_s, c_s)                 # optional: b read K-major
            sync()
            mma(dot, x_s, ct_s)
            sync()
        load(csq_s, c_sq[bid.y, tile(kt, BK)])   # epilogue operands
        sync()
        ewise(scores, csq_s, dot, beta=2.0, fn="sub")
        merge(best, arg, scores, base=kt * BK, limit=K)   # a running op: an arg-min (kmeans) or a top-k (knn)
    store(out[bid.y, tile(bid.x, BN)], arg)      # tail

``find_mainloop`` returns that structure as data, or raises ``Refused`` saying which statement does not
fit. It knows one more pattern inside the reduction: the squared row norms of the streamed operand
(``unary(sq, db_s, fn="square"); reduce(part, sq, axis=1); ewise(norm, norm, part)``, a top-k epilogue's seed),
which the warp-specialized form computes with ``sqnorm_rows``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cake_core.agents.rewrite import Refused, refuse_unless, view_syms, walk_nodes
from cake_core.ir.ops import Node, Op, View
from cake_core.ir.program import Program
from cake_core.ir.opdef import Family
from cake_core.ir.registry import REGISTRY, ops_of
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.ir.verify import build_ctx
from cake_core.targets import find_arch

RUNNING_OPS = ops_of(Family.RUNNING)   # the epilogue's running merge: an arg-min (one kept per row) or a top-k


@dataclass(frozen=True)
class Operand:
    """An smem tile loaded from a gmem view on every trip of the reduction loop."""

    buf: str
    view: View
    type: TileType


@dataclass(frozen=True)
class Epilogue:
    """What a candidate tile's scores feed: ``kind`` is ``argmin`` or ``topk``; ``state`` the running
    (value, index) rmem tiles; ``bias`` the per-column smem vector (loaded) or rmem norm (computed);
    ``beta`` the scale of the dot products; ``base``/``limit`` the candidate index and its bound."""

    kind: str
    state: tuple[str, str]
    bias: str
    beta: float
    base: object
    limit: object
    scores: str


@dataclass(frozen=True)
class Mainloop:
    """A CTA-collective contraction (see the module docstring)."""

    outer: Node | None               # the loop over candidate tiles, None for a plain GEMM
    red: Node                        # the reduction loop
    mma: Node
    a: Operand                       # rows x reduction (the accumulator's rows)
    b: Operand                       # the other operand, as loaded
    b_major: str                     # "n": b is (red, cols); "k": b is (cols, red), mma read its transpose
    acc: str
    head: tuple[Node, ...]           # top-level statements before the loops (allocations)
    epilogue_loads: tuple[tuple[str, View], ...] = ()   # smem vectors loaded once per outer trip
    epilogue: Epilogue | None = None
    norm: str | None = None          # rmem vector accumulating the squared row norms of b over the reduction
    tail: tuple[Node, ...] = ()      # stores after the loops
    dropped: frozenset[str] = field(default_factory=frozenset)   # buffers the rewrite no longer needs


def tile_types(p: Program) -> dict[str, TileType]:
    """The type of every tile and tensor of ``p`` (its verifier context's), or ``Refused`` without target data."""
    arch = find_arch(p.target)
    refuse_unless(arch is not None, f"no target data for {p.target}")
    return dict(build_ctx(p, arch).buffers)


def _running_state(merge: Node) -> tuple[str, str]:
    """The (value, index) tiles a running merge keeps: the operands it writes (``best, arg``; ``vals, idx``)."""
    value, index = (merge.arg(o.name) for o in merge.decl.operands if o.effect_of(merge).writes)
    return value, index


def find_mainloop(p: Program) -> Mainloop:
    """The contraction mainloop of a CTA-collective program (no roles), or ``Refused``."""
    refuse_unless(not any(n.op is Op.ROLE for n in p.body), "the program already has warp roles")
    refuse_unless(any(n.op is Op.MMA for n in walk_nodes(p.body)),
                  "no mma in the program: nothing for a wgmma consumer to do")
    loops = [i for i, n in enumerate(p.body) if n.op is Op.FOR]
    refuse_unless(len(loops) == 1, f"the kernel's top level has {len(loops)} loops; the mainloop split takes one "
                                   "loop nest (an optional loop over candidate tiles around a reduction loop)")
    i = loops[0]
    top = p.body[i]
    head, tail = p.body[:i], p.body[i + 1:]
    refuse_unless(all(n.op in (Op.SMEM, Op.RMEM, Op.LET) for n in head),
                  "only allocations may come before the mainloop")
    types = tile_types(p)
    inner = [n for n in top.body if n.op is Op.FOR]
    if any(n.op is Op.MMA for n in top.body):
        refuse_unless(not inner, "the reduction loop holds another loop")
        outer, red = None, top
        prologue, after = (), ()
    else:
        refuse_unless(len(inner) == 1 and any(n.op is Op.MMA for n in inner[0].body),
                      "no mma in a reduction loop (directly in the top loop or in the one loop it holds)")
        outer, red = top, inner[0]
        j = top.body.index(red)
        prologue, after = top.body[:j], top.body[j + 1:]
    loads: dict[str, View] = {}
    transposed: dict[str, str] = {}
    mma = None
    norm_sq: dict[str, str] = {}       # sq tile -> operand it squares
    norm_part: dict[str, str] = {}     # part vector -> operand
    norm = None
    for n in red.body:
        if n.op is Op.LOAD:
            dst = n.arg("dst")
            refuse_unless(types.get(dst) is not None and types[dst].space is MemSpace.SMEM,
                          f"`load` into `{dst}`, not an smem tile: the producer copies into shared memory")
            loads[dst] = n.arg("src")
        elif n.op is Op.SYNC:
            continue
        elif n.op is Op.TRANSPOSE and n.arg("src") in loads:
            transposed[n.arg("dst")] = n.arg("src")
        elif n.op is Op.MMA:
            refuse_unless(mma is None, "more than one mma in the reduction loop")
            mma = n
        elif n.op is Op.UNARY and n.attr("fn") == "square" and n.arg("src") in loads:
            norm_sq[n.arg("dst")] = n.arg("src")
        elif n.op is Op.REDUCE and n.arg("src") in norm_sq and n.attr("fn") == "sum" and n.attr("axis") in (1, -1):
            norm_part[n.arg("dst")] = norm_sq[n.arg("src")]
        elif n.op is Op.EWISE and n.attr("fn") == "add" and n.arg("dst") == n.arg("a") and n.arg("b") in norm_part \
                and n.attr("alpha") == 1.0 and n.attr("beta") == 1.0:
            norm = n.arg("dst")
        else:
            raise Refused(f"the reduction loop holds `{n.op.value}` (line {n.line}), which the producer/consumer "
                          "split does not place: it takes loads, syncs, a transpose of a loaded operand, the "
                          "squared row norms of one, and one mma")
    assert mma is not None
    acc, a_name, b_name = mma.arg("acc"), mma.arg("a"), mma.arg("b")
    refuse_unless(a_name in loads, f"mma's a operand `{a_name}` is not loaded in the reduction loop")
    if b_name in loads:
        b_major, b_src = "n", b_name
    else:
        refuse_unless(b_name in transposed, f"mma's b operand `{b_name}` is neither loaded nor a transpose of a "
                                            "loaded tile")
        b_major, b_src = "k", transposed[b_name]
    extra = set(loads) - {a_name, b_src}
    refuse_unless(not extra, f"the reduction loop loads {', '.join(sorted(extra))} besides the mma's operands")
    red_var = red.arg("var")
    for name in (a_name, b_src):
        refuse_unless(red_var in view_syms(loads[name]),
                      f"`{name}`'s window does not move with the reduction loop variable `{red_var}`")
    if norm is not None:
        refuse_unless(set(norm_part.values()) == {b_src}, "the row norms are not those of the streamed operand")
    ta, tb = types[a_name], types[b_src]
    refuse_unless(ta.dtype in (DType.BF16, DType.F16) and tb.dtype == ta.dtype,
                  "the mma operands are not both bf16 or both f16")
    for pro in prologue:
        refuse_unless(pro.op is Op.FILL and pro.arg("dst") in (acc, norm),
                      f"the candidate loop's prologue holds `{pro.op.value}` (line {pro.line}); only fills of the "
                      "accumulator and the norm vector are placed")
    epi_loads: list[tuple[str, View]] = []
    epi: Epilogue | None = None
    rest = [n for n in after if n.op is not Op.SYNC]
    k = 0
    while k < len(rest) and rest[k].op is Op.LOAD:
        dst = rest[k].arg("dst")
        refuse_unless(types[dst].space is MemSpace.SMEM and len(types[dst].shape) == 1,
                      f"the epilogue loads `{dst}`, not an smem vector")
        epi_loads.append((dst, rest[k].arg("src")))
        k += 1
    rest = rest[k:]
    if outer is not None:
        refuse_unless(len(rest) == 2, "the candidate loop's epilogue is not a score and a running merge")
        ew, merge = rest
        refuse_unless(ew.op is Op.EWISE and ew.attr("fn") == "sub" and ew.arg("b") == acc and ew.attr("alpha") == 1.0,
                      "the epilogue's scores are not `bias - beta * dots` (ewise sub of the accumulator)")
        bias = ew.arg("a")
        refuse_unless(bias in dict(epi_loads) or bias == norm,
                      f"the scores' bias `{bias}` is neither a loaded vector nor the row norms")
        refuse_unless(merge.op in RUNNING_OPS and merge.arg("scores") == ew.arg("dst"),
                      f"the scores do not feed a running merge ({', '.join(sorted(o.value for o in RUNNING_OPS))})")
        epi = Epilogue("argmin" if REGISTRY[merge.op].keeps_per_row == 1 else "topk", _running_state(merge), bias,
                       float(ew.attr("beta")), merge.arg("base"), merge.arg("limit"), ew.arg("dst"))
    else:
        refuse_unless(not rest and not epi_loads, "statements after the reduction loop that are not stores")
    for n in tail:
        refuse_unless(n.op is Op.STORE, f"`{n.op.value}` after the mainloop (line {n.line}); only stores are placed")
    dropped = {b_name} if b_major == "k" else set()
    if norm is not None:
        dropped |= set(norm_sq) | set(norm_part)
    if epi is not None:
        dropped.add(epi.scores)
    return Mainloop(outer, red, mma, Operand(a_name, loads[a_name], ta), Operand(b_src, loads[b_src], tb), b_major,
                    acc, tuple(head), tuple(epi_loads), epi, norm, tuple(tail), frozenset(dropped))
