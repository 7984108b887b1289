"""``cake export``'s work, from measured rows to a package: pick, lower, compile, write.

The flat list of steps (:func:`export_problem`): choose the GPU model; per shape, the fastest kernel measured
correct there (``routes.fastest``); the held-out shapes set aside (``routes.set_aside_held_out``, unless
``include_held_out``); routes; each routed kernel's IR parsed, checked against the problem, lowered
and compiled for the arch (nvcc, through the cubin cache); the manifest; the package (``package.write_package``).
A routed kernel that no longer builds (its text parses, lowers or compiles differently with today's Cake than
when it was measured) is set aside with its reason (``ExportResult.skipped``, the manifest's ``skipped``) and
its shapes go to the next fastest kernel measured correct there, until every routed kernel builds.
The rows come from ``warehouse.queries.export_rows``; this module never reads the warehouse itself.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from cake_core.export.manifest import KernelBuild, build_manifest, kernel_id, nvcc_version
from cake_core.export.package import check_name, write_package
from cake_core.export.routes import (ExportError, Route, build_routes, cede, fastest, gpu_models, peer_best,
                                     set_aside_held_out, usable)
from cake_core.ir.text import parse_program
from cake_core.lower.compile import compile_kernel, nvcc_path
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems.base import Problem
from cake_core.targets import find_arch, get_gpu, known_gpus


class SelectionError(ExportError):
    """The export asked for a GPU model, runs or shapes the warehouse holds no measurement of (bad usage)."""


@dataclass(frozen=True)
class ExportRequest:
    """What ``cake export`` was asked for."""

    out: Path
    name: str
    gpu_model: str | None = None
    arch: str | None = None                 # None: the GPU model's architecture
    shapes: tuple[str, ...] | None = None   # shape keys to export (None: every measured one)
    run_ids: tuple[str, ...] = ()
    domain_routes: bool = False
    include_held_out: bool = False          # route held-out shapes by their own measurements too
    cede_to_peer: bool = False              # leave a shape where the peer measured faster to the caller's fallback
    cache_dir: Path | None = None


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest: dict
    routes: list[Route] = field(default_factory=list)
    held_out_left: list[str] = field(default_factory=list)   # held-out shapes measured, routed as unmeasured
    skipped: dict[str, str] = field(default_factory=dict)      # IR hash -> why that measured kernel does not build
    ceded: dict[str, dict] = field(default_factory=dict)       # shape -> the peer faster there, and the kernel's time


def choose_gpu_model(rows: list[dict], asked: str | None, problem: str) -> str:
    """The GPU model to export for: the one asked, or the only one measured; a SelectionError otherwise."""
    models = gpu_models(rows)
    if asked is not None:
        if asked not in models:
            raise SelectionError(f"no correct measurement of {problem} on GPU model {asked!r}; measured on: "
                                 f"{', '.join(models)}")
        return asked
    if len(models) > 1:
        raise SelectionError(f"{problem} was measured on several GPU models ({', '.join(models)}); pick one with "
                             "--gpu-model")
    return models[0]


def _arch_for(asked: str | None, gpu_model: str) -> str:
    if asked is not None:
        if find_arch(asked) is None:
            raise SelectionError(f"--arch {asked}: no target data for it (cake_core/targets/archs/)")
        return asked
    return get_gpu(gpu_model).arch if gpu_model.upper() in known_gpus() else "sm_90a"


def compile_route_kernel(problem: Problem, ir_hash: str, ir_text: str, arch: str, cache_dir: Path | None) -> KernelBuild:
    """Parse, check, lower and compile one routed kernel; an ExportError naming the kernel when a step fails."""
    try:
        program = parse_program(ir_text, f"{ir_hash}.cake")
    except Exception as e:  # noqa: BLE001 - a kernel text the warehouse holds that no longer parses
        raise ExportError(f"kernel {ir_hash} no longer parses: {e}") from None
    why = problem.program_mismatch(program)
    if why:
        raise ExportError(f"kernel {ir_hash}: {why}")
    kid = kernel_id(program, ir_hash)
    low = lower(program, f"{kid}.cake")
    if low.outcome is not Outcome.OK:
        first = next((d for d in low.diagnostics if d.is_error), None)
        raise ExportError(f"kernel {kid} does not lower: {first.message if first else low.outcome.value}")
    comp = compile_kernel(low.value, arch=arch, cache_dir=cache_dir)
    if comp.outcome is not Outcome.OK:
        first = next((d for d in comp.diagnostics if d.is_error), None)
        raise ExportError(f"kernel {kid} does not compile for {arch}: {first.message if first else comp.outcome.value}")
    c = comp.value
    return KernelBuild(kid, ir_hash, program, low.value, Path(c.cubin_path).read_bytes(), c.resources.registers,
                       c.resources.spill_bytes)


def export_problem(problem: Problem, rows: dict, req: ExportRequest, now: dt.datetime | None = None) -> ExportResult:
    """Export ``problem``'s fastest kernels per shape as a package under ``req.out`` (see the module doc).

    ``rows``: ``measurements`` (with ``ir_hash`` and ``ir_text``), ``failed`` (attempt ids the final stage found
    wrong), ``peers`` (baselines of source peer) and ``roles`` (shape, role), as ``warehouse.queries.export_rows``
    returns them. A held-out shape's measurements route nothing unless ``req.include_held_out``: the result's
    ``held_out_left`` names the measured ones left to the nearest-shape routing. Raises :class:`SelectionError`
    for a selection the rows do not hold and :class:`ExportError` for anything else that stops the export (no
    correct measurement, no nvcc, a kernel that no longer compiles).
    """
    check_name(req.name)
    unknown = [r for r in req.run_ids if r not in rows["runs"]]
    if unknown:
        raise SelectionError(f"no run {unknown[0]!r} of {problem.name} in the warehouse; its runs: "
                             f"{', '.join(rows['runs']) or 'none'}")
    good = [r for r in rows["measurements"] if r["correct"] and usable(r)]
    where = f" in run(s) {', '.join(req.run_ids)}" if req.run_ids else ""
    if not good:
        raise ExportError(f"{problem.name} has no correct measurement timed with CUDA events from a cold L2{where}; "
                          f"run `cake evolve {problem.name}` on a GPU first")
    model = choose_gpu_model(good, req.gpu_model, problem.name)
    wanted = None if req.shapes is None else set(req.shapes)
    held_out = {r["shape"] for r in rows["roles"] if r["role"] == "held_out"}
    arch = _arch_for(req.arch, model)
    nvcc = nvcc_path()
    if nvcc is None:
        raise ExportError("nvcc was not found on PATH (nor /usr/local/cuda/bin, /usr/local/bin): install the CUDA "
                          "toolkit or set CAKE_NVCC=/path/to/nvcc; export compiles each kernel for the arch")
    kernels: dict[str, KernelBuild] = {}
    skipped: dict[str, str] = {}
    while True:
        winners, left = _winners(problem, rows, model, wanted, held_out, req.include_held_out, skipped, where)
        texts = {r["ir_hash"]: r["ir_text"] for r in winners.values() if r["ir_hash"] not in kernels}
        for h, text in texts.items():
            try:
                kernels[h] = compile_route_kernel(problem, h, text, arch, req.cache_dir)
            except ExportError as e:
                skipped[h] = str(e)
        if not any(h in skipped for h in texts):
            break
    peers = peer_best(rows["peers"], model)
    ceded: dict[str, dict] = {}
    if req.cede_to_peer:
        winners, ceded = cede(winners, peers)
        if not winners:
            raise ExportError(f"the peer measured faster than every kernel on each of the {len(ceded)} shapes; "
                              "nothing to export with --cede-to-peer")
    kernels = {h: kernels[h] for h in dict.fromkeys(r["ir_hash"] for r in winners.values())}
    routes = build_routes(winners, peers, held_out, req.domain_routes)
    now = now or dt.datetime.now(dt.timezone.utc)
    manifest = build_manifest(problem, routes, kernels, package=req.name, gpu_model=model, arch=arch,
                              static_limit=find_arch(arch).smem_static_limit_bytes, toolkit=nvcc_version(nvcc),
                              driver=None, run_ids=sorted({w.run_id for r in routes for w in r.wins}),
                              created_at=now.isoformat(timespec="seconds"))
    if skipped:
        manifest["skipped"] = [{"ir_hash": h, "why": why} for h, why in sorted(skipped.items())]
    if ceded:
        manifest["ceded"] = ceded
    path = write_package(req.out, req.name, manifest, list(kernels.values()), arch)
    return ExportResult(path, manifest, routes, left, skipped, ceded)


def _winners(problem: Problem, rows: dict, model: str, wanted: set[str] | None, held_out: set[str],
             include_held_out: bool, skipped: dict[str, str], where: str) -> tuple[dict[str, dict], list[str]]:
    """Per shape the fastest kernel measured correct on ``model`` among those not ``skipped``, and the held-out
    shapes set aside; a SelectionError when no shape is left (an ExportError when the builds emptied it)."""
    measured = [r for r in rows["measurements"] if r["ir_hash"] not in skipped]
    winners = fastest(measured, model, set(rows["failed"]), wanted)
    if not winners:
        if skipped:
            first = next(iter(skipped.values()))
            raise ExportError(f"no kernel measured correct on {model}{where} still builds: {len(skipped)} set aside "
                              f"({first}{'; ...' if len(skipped) > 1 else ''})")
        raise SelectionError(f"none of the {len(wanted or ())} selected shapes of {problem.name} was measured "
                             f"correct on {model}{where}")
    left: list[str] = []
    if not include_held_out:
        winners, left = set_aside_held_out(winners, held_out)
        if not winners:
            raise SelectionError(f"the {len(left)} shapes of {problem.name} measured correct on {model}{where} are "
                                 "all held out; pass --include-held-out to route them by their own measurements")
    return winners, left
