"""Great Expectations suites that every batch must pass before it lands.

Not-null expectations come from the schema (NOT NULL columns without a
default); value checks are listed here as data, one tuple per expectation.
The GX context, datasource and suites are built once per process on first use
(importing great_expectations alone takes seconds; building is milliseconds)
and reused, guarded by a lock so threads can share them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from warehouse.schema import load_schema

# ------------------------------------------------------------------ value sets

RUN_STATUS = ["running", "completed", "failed", "cancelled", "crashed"]
STAGES = ["verify", "lower", "compile", "cost_filter", "check", "time"]   # cake_core.pipeline.STAGES
OUTCOMES = ["verify_failed", "compile_failed", "filtered", "wrong", "runtime_fault",
            "timeout", "checked", "measured"]
SEVERITIES = ["error", "warning", "hint"]
BACKENDS = ["interpreter", "gpu"]
TIMERS = ["cuda_event", "cuda_graph"]   # runtime.gpu.TIMERS: one launch alone; back to back in a graph
# cold-clean: L2 flushed by a read (runtime.gpu.L2Flush); cold: by a write (measurements before 2026-11-29 11:00 UTC)
L2_STATES = ["cold-clean", "cold", "warm"]
# held_out: the final best only, never selected on; sweep: the finalists on the sweep rows, after the search
MEASURE_KINDS = ["search", "confirm", "held_out", "sweep"]
CHECK_KINDS = ["search", "held_out", "strict", "confirm", "sweep"]
STOP_REASONS = ["generations", "budget_candidates", "budget_gpu_minutes", "no_improvement"]
BASELINE_SOURCES = ["hand_written", "peer"]
SHAPE_ROLES = ["headline", "tail", "held_out"]
BASELINE_ROLES = SHAPE_ROLES + ["sweep"]     # a peer timed on a portfolio's sweep row (tasks/final._sweep_peers)
PROPOSAL_KINDS = ["rule", "primitive", "calibration", "tactic"]
DECISIONS = ["approved", "rejected"]
FILTER_DECISIONS = ["kept", "explored", "sampled", "filtered"]   # cake_core.model.filter.DECISIONS
MODEL_KINDS = ["analytic", "learned"]
RERUN_CAUSES = ["died", "timeout", "raised", "restart", "node_lost"]   # tasks.workers.LostWork.cause
RERUN_KINDS = ["search", "strict", "confirm", "held_out", "sweep", "baseline"]

# ------------------------------------------------------------------ checks


@dataclass(frozen=True)
class Check:
    """One expectation: GX class name and its keyword arguments."""
    kind: str
    kwargs: tuple[tuple[str, Any], ...]


def _in_set(column: str, values: list[str]) -> Check:
    return Check("ExpectColumnValuesToBeInSet", (("column", column), ("value_set", tuple(values))))


def _between(column: str, lo: float | None = None, hi: float | None = None, strict_lo: bool = False) -> Check:
    return Check("ExpectColumnValuesToBeBetween",
                 (("column", column), ("min_value", lo), ("max_value", hi), ("strict_min", strict_lo)))


def _a_ge_b(a: str, b: str) -> Check:
    return Check("ExpectColumnPairValuesAToBeGreaterThanB",
                 (("column_A", a), ("column_B", b), ("or_equal", True)))


VALUE_CHECKS: dict[str, list[Check]] = {
    "runs": [_in_set("status", RUN_STATUS), _between("generations", 0), _between("population", 1),
             _between("harness_version", 0), _in_set("stop_reason", STOP_REASONS), _between("session", 0),
             _between("budget_candidates", 1), _between("budget_gpu_minutes", 0, strict_lo=True),
             _between("patience", 1)],
    "attempts": [_in_set("stage", STAGES), _in_set("outcome", OUTCOMES), _between("generation", 0),
                 _between("slot", 0),
                 _between("gpu_seconds", 0), _between("prompt_tokens", 0),
                 _between("completion_tokens", 0), _between("predicted_ms", 0, strict_lo=True)],
    "diagnostics": [_in_set("severity", SEVERITIES)],
    "compiles": [_between("seconds", 0), _between("registers", 0), _between("spill_bytes", 0),
                 _between("smem_bytes", 0), _between("barriers", 0)],
    "predictions": [_between("predicted_ms", 0, strict_lo=True), _in_set("decision", FILTER_DECISIONS),
                    _in_set("model_kind", MODEL_KINDS)],
    "model_versions": [_in_set("kind", MODEL_KINDS)],
    "checks": [_in_set("backend", BACKENDS), _between("max_error", 0), _in_set("kind", CHECK_KINDS)],
    "measurements": [_in_set("timer", TIMERS), _in_set("l2", L2_STATES), _in_set("kind", MEASURE_KINDS),
                     _between("median_ms", 0, strict_lo=True), _between("p10_ms", 0, strict_lo=True),
                     _between("p90_ms", 0, strict_lo=True), _between("runs", 1),
                     _a_ge_b("median_ms", "p10_ms"), _a_ge_b("p90_ms", "median_ms")],
    "shapes": [_in_set("role", SHAPE_ROLES)],
    "proposals": [_in_set("kind", PROPOSAL_KINDS), _between("base_version", 0)],
    "decisions": [_in_set("decision", DECISIONS)],
    "harness_versions": [_between("version", 0)],
    "dispatch": [_between("median_ms", 0, strict_lo=True)],
    "stage_times": [_in_set("stage", ["generate", *STAGES, "select", "final"]), _between("wall_s", 0),
                    _between("work_s", 0), _between("n_in", 0), _between("n_out", 0), _between("workers", 0),
                    _between("generation", -1)],
    "reruns": [_in_set("cause", RERUN_CAUSES), _in_set("kind", RERUN_KINDS), _between("session", 0),
               _between("generation", -1), _between("pid", 1)],
    "baselines": [_in_set("source", BASELINE_SOURCES), _in_set("role", BASELINE_ROLES),
                  _between("median_ms", 0, strict_lo=True), _between("predicted_ms", 0, strict_lo=True)],
}


def checks_for(table: str) -> list[Check]:
    """Not-null checks for required columns, then the table's value checks."""
    cols = load_schema().columns[table]
    not_null = [Check("ExpectColumnValuesToNotBeNull", (("column", c.name),)) for c in cols if not c.nullable]
    return not_null + VALUE_CHECKS.get(table, [])


# ------------------------------------------------------------------ GX runtime


class _Validator:
    """The process-wide GX context: one pandas datasource, one asset and suite per table."""

    def __init__(self) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.ctx = gx.get_context(mode="ephemeral")
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        source = self.ctx.data_sources.add_pandas("cake_warehouse")
        self.batch_defs, self.suites = {}, {}
        for table in load_schema().arrow:
            asset = source.add_dataframe_asset(name=table)
            self.batch_defs[table] = asset.add_batch_definition_whole_dataframe(f"{table}_batch")
            suite = gx.ExpectationSuite(name=f"{table}_suite")
            for check in checks_for(table):
                suite.add_expectation(getattr(gx.expectations, check.kind)(**{
                    k: list(v) if isinstance(v, tuple) else v for k, v in check.kwargs}))
            self.suites[table] = self.ctx.suites.add(suite)
        self.lock = threading.Lock()

    def validate(self, table: str, batch: pa.Table) -> tuple[bool, list[str], dict]:
        # Lists (parents, witness) would make pandas comparisons slow and are never checked.
        simple = [f.name for f in batch.schema if not pa.types.is_list(f.type)]
        df = batch.select(simple).to_pandas()
        with self.lock:
            # GX judges every batch; a passing one needs only its verdict (a third of the time of the summary
            # GX computes by default), a failing one is validated again for the counts and examples it reports
            batch_obj = self.batch_defs[table].get_batch(batch_parameters={"dataframe": df})
            result = batch_obj.validate(self.suites[table], result_format="BOOLEAN_ONLY")
            if result.success:
                return True, [], {}
            result = batch_obj.validate(self.suites[table], result_format="SUMMARY")
        report = result.to_json_dict()
        failed = []
        for r in result.results:
            if not r.success:
                cfg = r.expectation_config
                cols = ",".join(str(cfg.kwargs[k]) for k in ("column", "column_A", "column_B") if k in cfg.kwargs)
                n = (r.result or {}).get("unexpected_count")
                sample = [_plain(v) for v in (r.result or {}).get("partial_unexpected_list", [])[:3]]
                failed.append(f"{cfg.type}({cols}): {n} unexpected, e.g. {sample}")
        return bool(result.success), failed, report


def _plain(value: Any) -> Any:
    """numpy scalars and tuples of them as plain Python values, for readable messages."""
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value.item() if hasattr(value, "item") else value


_validator: _Validator | None = None
_validator_lock = threading.Lock()


def _the_validator() -> _Validator:
    global _validator
    if _validator is None:
        with _validator_lock:
            if _validator is None:
                _validator = _Validator()
    return _validator


def validate(table: str, batch: pa.Table) -> tuple[bool, list[str], dict]:
    """Validate one batch; returns (success, failed expectation lines, GX report as JSON dict: empty for a
    batch that passed)."""
    return _the_validator().validate(table, batch)


def warm_up() -> threading.Thread:
    """Build the validator in a background thread (a process that will land rows soon, and waits for its
    services first, overlaps the seconds great_expectations takes to import with that wait); the first
    ``validate`` waits for it. An error here is left for that first ``validate`` to raise."""
    def build() -> None:
        try:
            _the_validator()
        except Exception:  # noqa: BLE001 - validate() builds it again and reports
            pass
    t = threading.Thread(target=build, name="cake-gx-warm-up", daemon=True)
    t.start()
    return t
