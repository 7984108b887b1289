"""The sweep flow: evolve a problem on each of a list of shape sets (default: every set it declares).

Each set is one evolution run (the evolve flow as a subflow), with the same parameters; every set is
checked before the first run starts, so a typo in the last one costs nothing. The evolve flow starts (or
joins) Ray itself, so a worker can run the sweep in a bare process.
"""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolve import evolve_flow
from tasks.run import check_shape_sets


@flow(name="sweep", log_prints=True, validate_parameters=False)
def sweep_flow(problem: str, shape_sets: list[str] | None = None, generations: int | None = None,
               population: int | None = None, seed: int | None = None, cold: bool | None = None,
               warehouse_root: str = ".cake/warehouse",
               cache_dir: str = ".cake/cache", gpu_models: list[str] | None = None) -> dict[str, Any]:
    """Evolve ``problem`` on each of ``shape_sets``; returns each run's summary by shape set. The parameters
    other than ``shape_sets`` are the evolve flow's (``tests/core/test_request.py`` holds them to it); each
    run's id is minted by the evolve flow."""
    sets = check_shape_sets(problem, shape_sets)
    runs: dict[str, Any] = {}
    for name in sets:
        runs[name] = evolve_flow(problem=problem, shape_set=name, generations=generations, population=population,
                                 seed=seed, cold=cold, warehouse_root=warehouse_root,
                                 cache_dir=cache_dir, gpu_models=gpu_models)
    return {"problem": problem, "runs": runs}
