"""Target facts: typed, frozen records read strictly from their data files, and the one loader everyone uses."""
from __future__ import annotations

import dataclasses
import json

import pytest

from cake_core.ir.targets import load_target
from cake_core.targets import (Arch, Gpu, TargetDataError, UnknownTarget, find_arch, get_arch, get_gpu,
                               gpu_for_name, known_archs, known_gpus, largest_l2_bytes)
from cake_core.targets.records import load_record


def test_every_arch_and_gpu_file_loads_into_its_record():
    assert known_archs() == ["sm_100a", "sm_90a"]
    assert known_gpus() == ["B200", "GB200", "H100", "H200"]
    hopper, blackwell = get_arch("sm_90a"), get_arch("sm_100a")
    assert hopper.smem_per_cta_bytes == 227 * 1024 and hopper.warpgroup_threads == 128
    assert hopper.wgmma is not None and hopper.wgmma.m == 64 and blackwell.wgmma is None
    assert hopper.runs_here and not blackwell.runs_here and blackwell.compute_capability == (10, 0)
    assert hopper.entry_regs(384) == 168 and hopper.entry_regs(128) == 255 // 8 * 8
    for name in known_gpus():
        g = get_gpu(name)
        assert isinstance(g, Gpu) and g.arch_data.arch == g.arch
    assert get_gpu("h200") is get_gpu("H200")               # one record per product, any case


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_arch("sm_90a").max_cluster_size = 16  # type: ignore[misc]


def test_an_unknown_target_is_named_with_the_known_ones():
    assert find_arch("sm_75") is None and find_arch("../etc") is None
    with pytest.raises(UnknownTarget, match="unknown target `sm_75`; known targets: sm_100a, sm_90a"):
        get_arch("sm_75")
    with pytest.raises(UnknownTarget, match="no data for GPU `A100`; known: B200, GB200, H100, H200"):
        get_gpu("A100")


def test_device_names_map_to_products():
    assert gpu_for_name("NVIDIA H200") == "H200" and gpu_for_name("NVIDIA GB200") == "GB200"
    assert gpu_for_name("NVIDIA B200") == "B200" and gpu_for_name(None) == "H200" and gpu_for_name("RTX") == "H200"
    assert largest_l2_bytes() == 128 << 20


def _write(tmp_path, data):
    p = tmp_path / "x.json"
    p.write_text(json.dumps(data))
    return p


def test_a_data_file_with_a_missing_unknown_or_mistyped_key_is_refused(tmp_path):
    good = json.loads(json.dumps(load_target("sm_90a")))
    assert load_record(Arch, _write(tmp_path, good)) == get_arch("sm_90a")
    missing = {k: v for k, v in good.items() if k != "warp_size"}
    with pytest.raises(TargetDataError, match="missing key\\(s\\) warp_size"):
        load_record(Arch, _write(tmp_path, missing))
    with pytest.raises(TargetDataError, match="unknown key\\(s\\) warps"):
        load_record(Arch, _write(tmp_path, {**good, "warps": 4}))
    with pytest.raises(TargetDataError, match="`max_cluster_size` must be int, got '8'"):
        load_record(Arch, _write(tmp_path, {**good, "max_cluster_size": "8"}))
    with pytest.raises(TargetDataError, match="`tma`: missing key\\(s\\) max_rank"):
        load_record(Arch, _write(tmp_path, {**good, "tma": {k: v for k, v in good["tma"].items() if k != "max_rank"}}))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TargetDataError, match="cannot read target data"):
        load_record(Arch, tmp_path / "bad.json")


def test_load_target_gives_the_data_as_a_dict():
    d = load_target("sm_90a")
    assert d["smem_per_cta_bytes"] == 232448 and d["tma"]["max_box_dim"] == 256 and d["mma_atoms"][-1] == "wgmma"
    assert load_target("sm_75") is None


def test_clustered_ctas_at_once_follow_the_measured_gpc_slots():
    h200, b200 = get_gpu("H200"), get_gpu("B200")
    assert h200.ctas_at_once(1, 1) == 132 and h200.ctas_at_once(1, 3) == 396
    assert h200.ctas_at_once(4, 1) == 120            # 30 clusters of 4, not 33
    assert h200.ctas_at_once(3, 1) == 117 and h200.ctas_at_once(2, 2) == 264
    assert h200.ctas_at_once(4, 3) == 372            # the 2-per-SM row scaled, whole clusters only
    assert h200.ctas_at_once(4, 8) == 992            # the 4-per-SM row scaled
    assert h200.ctas_at_once(20, 1) == 132 // 20 * 20   # a size not measured: every SM in whole clusters
    assert b200.cluster_slots is None and b200.ctas_at_once(4, 1) == 148 // 4 * 4


def test_smem_adds_per_sm_rise_with_the_warps_that_hide_their_latency():
    h200 = get_gpu("H200")
    rate = {lowering: [h200.smem_rmw_ops_per_s(lowering, n) for n in (4, 8, 16, 32, 64)]
            for lowering in ("atomic", "owned")}
    for lowering, r in rate.items():
        assert r == sorted(r) and r[0] < r[-1] / 2, lowering      # 4 warps: under half of 64 warps' rate
        row = next(x for x in h200.smem_rmw if x.lowering == lowering)
        assert r[-1] < row.per_clk * h200.sm_clock_hz             # the peak is approached, never passed
    assert h200.smem_rmw_ops_per_s("owned", 0) == h200.smem_rmw_ops_per_s("owned", 1)
    with pytest.raises(KeyError, match="no smem_rmw row for `gather`"):
        h200.smem_rmw_ops_per_s("gather", 16)
