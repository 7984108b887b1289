"""races.smem follows the compute ops as they are lowered: an axis op (reduce, scan, argmin...) runs between two
CTA barriers; an elementwise op (ewise, unary, fill, transpose...) loops over its destination's elements with no
barrier, each element by the thread that owns it. So a chain of elementwise ops over one tile needs no sync(),
while a tile another op wrote read by a broadcast, a transpose or after a load does (each passes with the sync()
and fails without it)."""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify

HEAD = '''@kernel(target="sm_90a", grid=(1,), threads=128, consts={"R": 64, "C": 32})
def k(x: gmem[f32, (R, C)], w: gmem[f32, (1, C)], y: gmem[f32, (R, C)], z: gmem[f32, (1, C)]):
    x_s = smem(f32, (R, C))
    w_s = smem(f32, (1, C))
    t_s = smem(f32, (R, C))
    tt_s = smem(f32, (C, R))
    c_s = smem(f32, (1, C))
    load(x_s, x[:, :])
    load(w_s, w[:, :])
    sync()
'''
TAIL = '''    sync()
    store(y[:, :], t_s)
    store(z[:, :], c_s)
'''


def _races(body: str) -> list[str]:
    return [d.message for d in verify(parse_program(HEAD + body + TAIL)) if d.rule == "races.smem"]


def test_a_chain_of_elementwise_ops_over_one_tile_needs_no_barrier():
    assert _races('''    ewise(t_s, x_s, w_s, fn="mul")
    unary(t_s, t_s, fn="exp")
    ewise(t_s, t_s, x_s, fn="add")
    fill(c_s, value=1.0)
''') == []


@pytest.mark.parametrize("body, tile", [
    # a broadcast read of a vector another elementwise op wrote: element c is the thread c's, read by all
    ('''    ewise(c_s, w_s, w_s, fn="add")
    ewise(t_s, x_s, c_s, fn="mul")
''', "c_s"),
    # a transpose reads its source at the transposed element
    ('''    ewise(t_s, x_s, x_s, fn="add")
    transpose(tt_s, t_s)
''', "t_s"),
    # a load writes by the copy's own thread map
    ('''    load(t_s, x[:, :])
    unary(t_s, t_s, fn="exp")
''', "t_s"),
])
def test_an_elementwise_read_of_another_threads_element_races_without_a_barrier(body, tile):
    found = _races(body)
    assert found and any(f"`{tile}`" in m for m in found), found
    lines = body.splitlines(keepends=True)
    fixed = "".join(lines[:-1]) + "    sync()\n" + lines[-1]
    assert _races(fixed) == []


def test_an_axis_op_is_fenced_by_its_own_barriers():
    assert _races('''    ewise(t_s, x_s, w_s, fn="mul")
    reduce(c_s, t_s, axis=0)
    ewise(t_s, x_s, c_s, fn="sub")
''') == []


def test_a_read_of_a_copy_still_landing_is_a_race_even_through_an_axis_op_barrier():
    text = (HEAD + '''    cp_async(t_s, x[:, :])
    reduce(c_s, t_s, axis=0)
    cp_async_wait(0)
''' + TAIL)
    found = [d.message for d in verify(parse_program(text)) if d.rule == "races.smem"]
    assert any("may still be landing" in m for m in found), found
