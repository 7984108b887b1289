"""A candidate's journey: the attempt, the flat list of stages, their typed results, attempt -> rows.

    generate -> verify -> lower -> compile -> cost_filter -> check | time -> select

- ``attempt``   the :class:`Attempt` (identity from run, generation and slot; every stage's result)
- ``stages``    ``STAGES`` and the stage functions (verify, lower, compile, cost filter, CPU check)
- ``generate``  the agent of a run and the generate stage
- ``verdicts``  right or wrong, decided once: per-shape verdicts and :func:`judge`
- ``execute``   every call into the runtime (interpreter gate, GPU gate and timing, peers)
- ``state``     the select stage: a run's state rebuilt from its rows (resume = the same computation)
- ``request``   a run's parameters, defined once (``RunRequest``), and its run id
- ``plan``      a run's plan, new or resumed, and the one check of a request (``plan_run``)
- ``progress``  where a run stands, as the warehouse says (``RunProgress``)
- ``policy``    how a run spends its workers and GPUs: job order, batching, cutoffs, strict gate, confirmation
- ``rows``      every warehouse row, as plain dicts
- ``debug``     re-verify after every stage and dump numbered IR

Nothing here imports Prefect, Ray or DuckDB; ``tasks/`` wraps the stages and appends the rows.
"""
from cake_core.pipeline.attempt import Attempt, attempt_id_for
from cake_core.pipeline.stages import (STAGE_NAMES, STAGES, Binary, Stage, check_stage, compile_stage,
                                       cost_filter_stage, lower_stage, nvcc_available, stages_for, verify_stage)

__all__ = ["Attempt", "attempt_id_for", "STAGES", "STAGE_NAMES", "Stage", "Binary", "stages_for", "verify_stage",
           "lower_stage", "compile_stage", "cost_filter_stage", "check_stage", "nvcc_available"]
