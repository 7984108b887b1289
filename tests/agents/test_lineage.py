"""An attempt's lineage walks its parents back to the seed with each step's time and op-count changes."""
import numpy as np
import pytest

from cake_core.agents.lineage import Node, lineage_path, render
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem


def _attempts():
    seed = parse_program(get_problem("gemm_bf16").seed_text())
    ws = apply("warp_specialize", seed, np.random.default_rng(0))
    tma = apply("tma", ws, np.random.default_rng(0))
    rows = [Node("a0", seed.hash, seed.text(), "seed", (), predicted_ms=9.0),
            Node("a1", ws.hash, ws.text(), "warp_specialize", (seed.hash,), measured_ms=2.0),
            Node("a2", tma.hash, tma.text(), "tma+retile", (ws.hash,), measured_ms=1.5)]
    return {r.attempt_id: r for r in rows}, {r.ir_hash: r for r in rows}


def test_the_path_runs_from_the_seed_with_times_and_op_changes():
    by_id, by_hash = _attempts()
    steps = lineage_path("a2", by_id, by_hash)
    assert [s.attempt_id for s in steps] == ["a0", "a1", "a2"]
    assert [s.tactic for s in steps] == ["seed", "warp_specialize", "tma+retile"]
    assert steps[1].ops_changed["role"] == (0, 2) and steps[1].ops_changed["load"][1] == 0
    assert steps[2].ops_changed["tma_load"][1] > 0 and steps[2].ops_changed["cp_async_bar"][1] == 0
    text = render(steps)
    assert "9 ms predicted" in text and "1.5 ms measured" in text and "wgmma 0->1" in text


def test_an_unknown_attempt_is_a_key_error_and_a_missing_parent_ends_the_walk():
    by_id, by_hash = _attempts()
    with pytest.raises(KeyError):
        lineage_path("nope", by_id, by_hash)
    del by_hash[by_id["a1"].ir_hash]
    assert [s.attempt_id for s in lineage_path("a2", by_id, by_hash)] == ["a2"]
