"""Plain stores of different CTAs to one gmem element: the interpreter runs the CTAs one after another, the GPU
does not, so the last store to land is the hardware's choice. Different values there are an InterpFault naming
both CTAs and the element; the same value (a benign overlap), and atomic adds, are not."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.text import parse_program

COPY = """@kernel(target="sm_90a", grid=(2,), threads=32, consts={"W": 4})
def copy(x: gmem[f32, (N,)], y: gmem[f32, (N,)]):
    t = smem(f32, (W,))
    load(t, x[tile(SRC, W)])
    sync()
    store(y[tile(DST, W)], t)
"""
ADD = """@kernel(target="sm_90a", grid=(2,), threads=32, consts={"W": 4})
def add(x: gmem[f32, (N,)], y: gmem[f32, (N,)]):
    t = smem(f32, (W,))
    load(t, x[tile(bid.x, W)])
    sync()
    atomic_add(y[tile(0, W)], t)
"""


def _run(text, src, dst, y0=np.nan):
    x = np.arange(1, 9, dtype=np.float32)
    y = np.full(8, y0, np.float32)
    interp.run(parse_program(text.replace("SRC", src).replace("DST", dst)), {"N": 8}, {"x": x}, {"y": y})
    return x, y


def test_each_cta_its_own_elements_is_no_race():
    x, y = _run(COPY, "bid.x", "bid.x")
    np.testing.assert_array_equal(y, x)


def test_two_ctas_storing_other_values_into_one_element_is_a_race():
    with pytest.raises(interp.InterpFault, match=r"line 6: CTAs \(0, 0, 0\) and \(1, 0, 0\) both store `y`\[0\], "
                                                 r"other values.*a race between CTAs"):
        _run(COPY, "bid.x", "0")


def test_two_ctas_storing_the_same_values_is_benign():
    x, y = _run(COPY, "0", "0")
    np.testing.assert_array_equal(y[:4], x[:4])
    assert np.isnan(y[4:]).all()


def test_atomic_adds_of_several_ctas_into_one_element_are_no_race():
    x, y = _run(ADD, "", "", y0=0.0)
    np.testing.assert_array_equal(y[:4], x[:4] + x[4:])
