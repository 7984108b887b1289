"""Prefect tasks of the sweep flow: which recorded kernels of a problem are worth re-timing."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from warehouse import Warehouse

# A kernel measured correct on a GPU ranks by the geomean of its medians; one only checked on the
# CPU (never timed) ranks after every measured one, by its predicted time.
_BEST_KERNELS = """
with m as (
    select attempt_id, exp(avg(ln(median_ms))) as g from measurements where correct group by attempt_id
), c as (
    select a.attempt_id, a.ir_hash, a.ir_text, case when m.g is null then 1 else 0 end as tier,
           coalesce(m.g, a.predicted_ms) as score
    from attempts a left join m using (attempt_id)
    where a.problem = ? and a.outcome in ('measured', 'checked') and coalesce(m.g, a.predicted_ms) is not null
)
select attempt_id, ir_hash, ir_text, tier, score from c
qualify row_number() over (partition by ir_hash order by tier, score, attempt_id) = 1
order by tier, score, ir_hash
limit ?
"""


@task(name="best-kernels", cache_policy=NO_CACHE)
def best_kernels(warehouse_root: str, problem: str, top: int) -> list[dict[str, Any]]:
    """The ``top`` distinct kernels of ``problem`` that passed their checks, best first.

    Each row: ``attempt_id``, ``ir_hash``, ``ir_text``, ``tier`` (0: measured on a
    GPU, 1: checked on the CPU only) and ``score`` (ms: measured geomean, or
    predicted for tier 1).
    """
    return Warehouse(warehouse_root).query(_BEST_KERNELS, [problem, int(top)]).to_pylist()
