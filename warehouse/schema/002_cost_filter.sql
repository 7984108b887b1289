-- Cake warehouse, schema version 2: what the cost filter decided, and the cost-model versions.
--
-- predictions: one row per attempt and shape, as before; a filter that records its decisions fills
-- model_kind, score and decision (null in rows written before).

alter table predictions add column model_kind VARCHAR;   -- analytic | learned
alter table predictions add column score DOUBLE;         -- the model's ranking key (higher: predicted faster)
alter table predictions add column decision VARCHAR;     -- kept | explored | sampled | filtered

-- Each fitted or evaluated model version, with its held-out figures (cake model fit / eval).
create table model_versions (
    version        VARCHAR   NOT NULL,
    kind           VARCHAR   NOT NULL,  -- analytic | learned
    gpu            VARCHAR   NOT NULL,
    target         VARCHAR   NOT NULL,
    path           VARCHAR,             -- the model file, when saved
    split          VARCHAR,             -- run | time: how the held-out figures were made
    trained_on     VARCHAR,             -- JSON: samples, groups, runs
    evaluation     VARCHAR   NOT NULL,  -- JSON: held-out figures per problem and overall, the comparison
    beats_analytic BOOLEAN,
    created_at     TIMESTAMP NOT NULL DEFAULT current_timestamp
);

create or replace view cost_model_error as
select p.attempt_id, a.run_id, a.generation, a.problem, p.shape, p.model_version, p.model_kind, p.decision,
       m.gpu_model, m.timer, m.l2, m.kind,
       p.predicted_ms, m.median_ms as measured_ms,
       p.predicted_ms / m.median_ms         as ratio,
       abs(ln(p.predicted_ms / m.median_ms)) as abs_log_error
from predictions p
join measurements m on m.attempt_id = p.attempt_id and m.shape = p.shape
left join attempts a on a.attempt_id = p.attempt_id;

-- The filter grading itself on live data: per run, generation and shape, the fastest measured survivor
-- (kept or explored) against the fastest of the filtered-out candidates that were timed anyway
-- (sampled). missed_best: a sampled one was faster than every survivor. sample_fraction: the share of
-- the filtered-out candidates that were sampled (misses among the unsampled ones go unseen).
create or replace view cost_filter_recall as
with d as (
    select p.attempt_id, p.shape, any_value(p.decision) as decision, any_value(p.model_version) as model_version,
           any_value(a.run_id) as run_id, any_value(a.generation) as generation, any_value(a.problem) as problem
    from predictions p join attempts a using (attempt_id)
    where p.decision is not null
    group by p.attempt_id, p.shape
), t as (
    select d.*, m.median_ms
    from d left join measurements m
      on m.attempt_id = d.attempt_id and m.shape = d.shape and m.kind = 'search' and m.correct
), g as (
    select run_id, generation, problem, shape, any_value(model_version) as model_version,
           count(*) filter (where decision in ('kept', 'explored'))                   as survivors,
           count(*) filter (where decision = 'sampled')                               as sampled,
           count(*) filter (where decision = 'filtered')                              as filtered,
           min(median_ms) filter (where decision in ('kept', 'explored'))             as best_survivor_ms,
           max(median_ms) filter (where decision in ('kept', 'explored'))             as worst_survivor_ms,
           min(median_ms) filter (where decision = 'sampled')                         as best_sampled_ms
    from t group by run_id, generation, problem, shape
)
select g.*,
       best_sampled_ms < best_survivor_ms                                            as missed_best,
       sampled::DOUBLE / nullif(sampled + filtered, 0)                               as sample_fraction,
       (select count(*) from t where t.run_id = g.run_id and t.generation = g.generation and t.shape = g.shape
          and t.decision = 'sampled' and t.median_ms < g.worst_survivor_ms)          as sampled_beat_worst
from g
order by run_id, generation, shape;
