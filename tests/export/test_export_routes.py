"""Routes from measured rows (no nvcc, no GPU): the fastest correct kernel per shape, wrong ones ignored; the
exported domain agrees with ``ir.domain``; the manifest evaluator refuses anything outside its grammar."""
from __future__ import annotations

import itertools

import pytest

from cake_core.export.dispatcher_template import BadExpression, domain_refusal, evaluate, model_matches
from cake_core.export.routes import build_routes, domain_data, fastest, gpu_models, peer_best
from cake_core.ir.domain import domain_violations
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from export_rows import PROBLEM, expected, ir_hash, land, shapes


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from warehouse.queries import export_rows
    root = tmp_path_factory.mktemp("routes") / "warehouse"
    land(root)
    return export_rows(root, PROBLEM)


def test_each_shape_goes_to_its_fastest_correct_kernel(rows):
    won = fastest(rows["measurements"], "H200", set(rows["failed"]))
    assert {s: r["ir_hash"] for s, r in won.items()} == {s: ir_hash(k) for s, k in expected().items()}
    s = shapes()
    assert won[s[0]]["median_ms"] == 0.2 and won[s[0]]["kind"] == "confirm"   # the confirmation beats the search
    assert won[s[3]]["median_ms"] == 1.0          # 0.01 ms, but wrong there
    assert won[s[4]]["ir_hash"] != ir_hash("FAILED")  # fastest, but wrong when confirmed
    assert gpu_models(rows["measurements"]) == ["H100", "H200"]
    assert fastest(rows["measurements"], "H200", set(rows["failed"]), {s[2]}).keys() == {s[2]}


def test_routes_carry_their_shapes_medians_peers_and_held_out_flags(rows):
    won = fastest(rows["measurements"], "H200", set(rows["failed"]))
    held = {r["shape"] for r in rows["roles"] if r["role"] == "held_out"}
    routes = build_routes(won, peer_best(rows["peers"], "H200"), held, domain_routes=True)
    assert [r.kind for r in routes] == ["exact"] * 3 + ["domain"] * 3
    assert routes[0].ir_hash == ir_hash("SEED") and len(routes[0].wins) == 3      # most shapes first
    s = shapes()
    ws = next(r for r in routes if r.ir_hash == ir_hash("WS"))
    assert {w.shape: (w.median_ms, w.peer, w.peer_ms) for w in ws.wins} == {
        s[0]: (0.2, "flash_kmeans", 0.4), s[1]: (0.3, "flash_kmeans", 0.5)}
    assert [w.shape for r in routes for w in r.wins if w.held_out] == [s[5]]


@pytest.mark.parametrize("file", ["kmeans_assign_ws.cake", "kmeans_assign_unaligned.cake",
                                  "kmeans_assign_pingpong_mc.cake"])
def test_the_exported_domain_refuses_what_ir_domain_refuses(file):
    prob = get_problem(PROBLEM)
    program = parse_program(prob.kernel_text(file))
    data = domain_data(program, prob.dims)
    assert data["extents"] and all(isinstance(e["dim"], str) for e in data["extents"])
    for B, N, K, D in itertools.product((1, 3), (33, 128), (7, 64, 130), (9, 20, 64, 128, 136, 200)):
        shape = {"B": B, "N": N, "K": K, "D": D}
        assert bool(domain_refusal(data, shape, program.const_env)) == bool(domain_violations(program, shape)), shape


def test_the_evaluator_reads_the_grammar_and_nothing_else():
    env = {"N": 100, "BN": 64, "B": 3, "num_sms": 132}
    assert evaluate("cdiv(N, BN)", env) == 2 and evaluate("min(B * cdiv(N, BN), num_sms)", env) == 6
    assert evaluate("2 * N % 16", env) == 8 and evaluate("-1 + N // 3 - max(B, 4)", env) == 28
    assert evaluate("N <= 128", env, compare=True) is True
    for bad in ("__import__('os').system('true')", "N ** 2", "N / 2", "N.real", "[N]", "N if B else 0",
                "lambda: 0", "cdiv(N)", "min(N, B, 1)", "abs(N)", "N < B < 3", "1.5", "'N'", "N and B",
                "cdiv(N, BN=1)", "N[0]"):
        with pytest.raises(BadExpression) as e:
            evaluate(bad, env)
        assert "\n" not in str(e.value)
    with pytest.raises(BadExpression):
        evaluate("N <= 128", env)                 # a comparison only where a domain condition is read
    with pytest.raises(BadExpression):
        evaluate("N // (B - 3)", env)


def test_a_device_name_names_its_model_as_a_whole_word():
    assert model_matches("NVIDIA H200", "H200") and model_matches("NVIDIA H100 80GB HBM3", "H100")
    assert not model_matches("NVIDIA H100 80GB HBM3", "H200") and not model_matches("NVIDIA GB200", "B200")
    assert model_matches("NVIDIA GeForce RTX 4090", "NVIDIA-GeForce-RTX-4090")


def test_a_dimension_no_tensor_has_is_passed_to_run_by_name():
    # a flag dimension (here S, as knn_search's self-search) is the extent of no tensor: run() cannot infer it,
    # so it takes it by name; routes tell its values apart, and the fallback gets it back
    from cake_core.export.dispatcher_template import BadArgument, Dispatcher, ShapeNotCovered

    class Fake:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    key = "B=1,Q=8,M=64,D=16,k=4,S=2"
    spec = lambda name, dtype, shape: {"name": name, "dtype": dtype, "role": "data", "shape": shape}   # noqa: E731
    d = Dispatcher({"problem": "p", "gpu_model": "H200", "dims": ["B", "Q", "M", "D", "k", "S"], "consts": {},
                    "tensors": [spec("q", "bf16", ["B", "Q", "D"]), spec("db", "bf16", ["B", "M", "D"]),
                                spec("idx", "i32", ["B", "Q", "k"])],
                    "kernels": [{"id": "kern", "kernel_name": "knn", "domain": {}, "consts": {}}],
                    "routes": [{"kind": "exact", "kernel": "kern", "shapes": {key: {"median_ms": 0.1}}}],
                    "exact": {key: 0}}, folder=None)
    assert d.scalars == ["S"]
    assert d.covered(B=1, Q=8, M=64, D=16, k=4, S=2) and not d.covered(B=1, Q=8, M=64, D=16, k=4, S=1)
    ts = {"q": Fake((1, 8, 16), "torch.bfloat16"), "db": Fake((1, 8, 16), "torch.bfloat16"),
          "idx": Fake((1, 8, 4), "torch.int32")}
    with pytest.raises(BadArgument, match=r"run\(\) takes q, db, idx, S \(an int\); missing S"):
        d.run(**ts)
    with pytest.raises(BadArgument, match="unknown T"):
        d.run(**ts, S=1, T=3)
    with pytest.raises(BadArgument, match="each an int >= 1"):
        d.run(**ts, S="1")
    seen = []
    assert d.run(fallback=lambda **a: seen.append(a["S"]) or "served", **ts, S=1) == "served" and seen == [1]
    with pytest.raises(ShapeNotCovered, match="B=1,Q=8,M=8,D=16,k=4,S=1"):
        d.run(**ts, S=1)
