"""Routes from measured rows (no nvcc, no GPU): the fastest correct kernel per shape, wrong ones ignored, held-out
shapes set aside; the exported domain agrees with ``ir.domain``; the manifest evaluator refuses anything outside
its grammar; a shape no run measured goes to the kernel of the nearest measured shape whose domain holds it."""
from __future__ import annotations

import itertools

import pytest

from cake_core.export.dispatcher_template import (BadArgument, BadExpression, Dispatcher, ShapeNotCovered, distance,
                                                  domain_refusal, evaluate, model_matches, shape_point)
from cake_core.export.routes import build_routes, domain_data, fastest, gpu_models, peer_best, set_aside_held_out
from cake_core.ir.domain import domain_violations
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from export_rows import PROBLEM, expected, ir_hash, land, shapes


class Fake:
    """What run() reads of a tensor before any CUDA call: its shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


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


def test_held_out_shapes_are_set_aside_from_the_winners(rows):
    won = fastest(rows["measurements"], "H200", set(rows["failed"]))
    held = {r["shape"] for r in rows["roles"] if r["role"] == "held_out"}
    kept, left = set_aside_held_out(won, held)
    s = shapes()
    assert left == [s[5]] and s[5] in won and kept.keys() == won.keys() - {s[5]}
    assert not any(w.held_out for r in build_routes(kept, {}, held) for w in r.wins)


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


def nearest_dispatcher(domain_routes: bool = True) -> Dispatcher:
    """Kernel ``a`` (N a multiple of 16) won M=1,N=16; kernel ``b`` (N at most 64) won M=1,N=64."""
    x = {"name": "x", "dtype": "f32", "role": "data", "shape": ["M", "N"]}
    a = {"id": "a", "kernel_name": "ka", "consts": {}, "domain": {"extents": [], "multiples": [
        {"rule": "r", "param": "x", "expr": "N", "value": 16, "when": []}]}}
    b = {"id": "b", "kernel_name": "kb", "consts": {}, "domain": {"multiples": [], "extents": [
        {"param": "x", "axis": 1, "dim": "N", "accesses": [{"end": 64, "when": []}]}]}}
    routes = [{"kind": "exact", "kernel": "a", "shapes": {"M=1,N=16": {"median_ms": 0.1}}},
              {"kind": "exact", "kernel": "b", "shapes": {"M=1,N=64": {"median_ms": 0.3, "held_out": False}}}]
    if domain_routes:
        routes += [{"kind": "domain", "kernel": "a", "shapes": {}}, {"kind": "domain", "kernel": "b", "shapes": {}}]
    return Dispatcher({"problem": "p", "gpu_model": "H200", "dims": ["M", "N"], "consts": {}, "tensors": [x],
                       "kernels": [a, b], "routes": routes, "exact": {"M=1,N=16": 0, "M=1,N=64": 1}}, folder=None)


def test_an_unmeasured_shape_goes_to_the_nearest_measured_shape_whose_kernel_holds_it():
    d = nearest_dispatcher()
    assert distance(shape_point({"M": 2, "N": 16}, ["M", "N"]), shape_point({"M": 1, "N": 64}, ["M", "N"])) == 3

    def near(**shape):
        r = d.route_of(**shape)
        return r["kernel"], r["nearest_shape"]

    assert near(M=2, N=16) == ("a", "M=1,N=16")             # distance 1 to a's shape, 3 to b's
    assert near(M=1, N=48) == ("b", "M=1,N=64")             # a multiple of 16, but nearer b's shape
    assert near(M=1, N=32) == ("a", "M=1,N=16")             # 1 from each: the smaller key
    # N=20 is nearest a's shape, but a's domain refuses it (not a multiple of 16): b's holds it
    assert near(M=1, N=20) == ("b", "M=1,N=64")
    assert d.route_of(M=1, N=20) == {"kernel": "b", "kernel_name": "kb", "route": "nearest", "median_ms": None,
                                     "peer_ms": None, "held_out": False, "nearest_shape": "M=1,N=64",
                                     "nearest_ms": 0.3}
    assert d.route_of(M=1, N=64) == {"kernel": "b", "kernel_name": "kb", "route": "exact", "median_ms": 0.3,
                                     "peer_ms": None, "held_out": False, "nearest_shape": None, "nearest_ms": None}
    # in no kernel's domain (past b's 64, not a multiple of 16): refused, before any CUDA call
    assert not d.covered(M=1, N=100) and d.route_of(M=1, N=100) is None
    with pytest.raises(ShapeNotCovered, match="M=1,N=100 .*no kernel's domain"):
        d.run(x=Fake((1, 100), "torch.float32"))
    assert d.run(fallback=lambda **t: "served", x=Fake((1, 100), "torch.float32")) == "served"
    assert d.route({"M": 1, "N": 0}) is None                # an empty tensor's extent has no log2
    with pytest.raises(BadArgument):
        d.covered(M=1, N=0)


def test_without_domain_routes_only_the_measured_shapes_are_served():
    d = nearest_dispatcher(domain_routes=False)
    assert d.covered(M=1, N=16) and not d.covered(M=1, N=32) and d.route_of(M=2, N=16) is None
    with pytest.raises(ShapeNotCovered, match="exported without --unmeasured"):
        d.run(x=Fake((1, 32), "torch.float32"))
