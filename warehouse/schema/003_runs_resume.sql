-- Cake warehouse, schema version 3: resumable runs, cold starts, budgets and stop reasons,
-- held-out rows measured apart, time per stage, the hand-written and peer baselines of a run,
-- and the one definition of a kernel's score (`kernel_scores`) that everything ranks by.
--
-- Old batches stay readable: a column added here reads as NULL in them (never its DEFAULT),
-- so queries wrap the new columns in coalesce().

-- ---------------------------------------------------------------- runs

alter table runs add column cold BOOLEAN DEFAULT false;       -- started from the naive seed alone
alter table runs add column session INTEGER DEFAULT 0;        -- 0 for the first job, +1 per --resume
alter table runs add column stop_reason VARCHAR;              -- see expectations.STOP_REASONS
alter table runs add column budget_candidates INTEGER;        -- attempts the run may make in all
alter table runs add column budget_gpu_minutes DOUBLE;        -- GPU time its attempts may hold in all
alter table runs add column patience INTEGER;                 -- generations without a better best
alter table runs add column check_shape_set VARCHAR;          -- CPU only: interpreter checks on this set

-- ---------------------------------------------------------------- attempts, checks

alter table attempts add column slot INTEGER;                  -- position in its generation (from 0)
alter table checks add column kind VARCHAR DEFAULT 'search';   -- search | held_out (final best) | strict

-- ---------------------------------------------------------------- new tables

-- Wall time of each stage of each generation (one row per stage and generation and job), and
-- the seconds its workers spent (summed over the attempts it ran: more than the wall time when
-- several workers ran at once).
create table stage_times (
    run_id      VARCHAR   NOT NULL,
    session     INTEGER   NOT NULL,
    generation  INTEGER   NOT NULL,   -- -1: the final stage (confirm, held-out, baselines)
    stage       VARCHAR   NOT NULL,
    wall_s      DOUBLE    NOT NULL,
    work_s      DOUBLE    NOT NULL,
    n_in        INTEGER   NOT NULL,
    n_out       INTEGER   NOT NULL,
    workers     INTEGER   NOT NULL,
    recorded_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- What a run's best is measured against, in the same run: the problem's hand-written kernels
-- and its peers (cuBLAS, flash-kmeans, torch). Never parents of a run: they live apart from attempts.
create table baselines (
    run_id       VARCHAR   NOT NULL,
    name         VARCHAR   NOT NULL,   -- seed file of a hand-written kernel, or the peer's name
    source       VARCHAR   NOT NULL,   -- hand_written | peer
    shape        VARCHAR   NOT NULL,
    role         VARCHAR   NOT NULL,   -- headline | tail | held_out
    gpu_model    VARCHAR,
    timer        VARCHAR,
    l2           VARCHAR,
    median_ms    DOUBLE,               -- NULL: not timed (no GPU, wrong, fault, unavailable)
    p10_ms       DOUBLE,
    p90_ms       DOUBLE,
    runs         INTEGER,
    predicted_ms DOUBLE,               -- the cost model's figure (hand-written kernels)
    correct      BOOLEAN,              -- NULL: not checked
    message      VARCHAR,
    measured_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- ---------------------------------------------------------------- views

-- A run's current state: the latest job (session) first, then a finished status beats
-- 'running', then the latest recorded row.
create or replace view runs_latest as
select * from runs
qualify row_number() over (
    partition by run_id
    order by coalesce(session, 0) desc, (status <> 'running') desc, recorded_at desc,
             finished_at desc nulls last
) = 1;

-- The score of every kernel a run judged, lower is better: the one definition of "best" that
-- the evolution's selection, the live display, the convergence view and the dispatch table use.
--   measured  : the geometric mean of its correct search medians, for a kernel measured on every
--               shape the run searches (held-out rows are measured apart, kind 'held_out', and
--               never count);
--   predicted : a kernel checked on the CPU (not timed): the cost model's geometric mean over the
--               run's search shapes.
-- Ties go to the earlier generation, then the earlier slot, then the IR hash: never to chance.
create or replace view kernel_scores as
with searched as (
    select run_id, attempt_id, count(distinct shape) as n_shapes, exp(avg(ln(median_ms))) as score_ms
    from measurements where kind = 'search' and correct
    group by run_id, attempt_id
), run_shapes as (
    select run_id, count(distinct shape) as n_shapes from measurements where kind = 'search' group by run_id
), measured as (
    select s.run_id, s.attempt_id, 'measured' as basis, s.score_ms, s.n_shapes
    from searched s join run_shapes r using (run_id)
    where s.n_shapes = r.n_shapes
), predicted as (
    select a.run_id, a.attempt_id, 'predicted' as basis, a.predicted_ms as score_ms,
           cast(null as BIGINT) as n_shapes
    from attempts a
    where a.outcome = 'checked' and a.predicted_ms is not null
), scored as (
    select * from measured union all by name select * from predicted
)
select s.run_id, s.attempt_id, a.generation, a.slot, a.ir_hash, a.tactic, a.outcome, s.basis, s.score_ms,
       s.n_shapes
from scored s left join attempts a using (attempt_id);

-- Each run's best kernel (see kernel_scores).
create or replace view run_best as
select k.*, a.ir_text
from kernel_scores k left join attempts a using (attempt_id)
qualify row_number() over (
    partition by k.run_id order by k.score_ms, k.generation, k.slot, k.ir_hash
) = 1;

-- Per run and searched shape, the kernel to dispatch on: the fastest correct search median
-- (held-out rows are never searched), reported with its confirmatory median where the final
-- stage re-measured it.
create or replace view shape_best as
with searched as (
    select m.run_id, m.shape, m.attempt_id, m.median_ms as search_ms, a.ir_hash, a.generation, a.slot
    from measurements m left join attempts a using (attempt_id)
    where m.kind = 'search' and m.correct
    qualify row_number() over (
        partition by m.run_id, m.shape order by m.median_ms, a.generation, a.slot, a.ir_hash) = 1
), confirmed as (
    select run_id, shape, attempt_id, min(median_ms) as confirm_ms
    from measurements where kind = 'confirm' and correct group by all
)
select s.run_id, s.shape, s.attempt_id, s.ir_hash, s.search_ms, c.confirm_ms,
       coalesce(c.confirm_ms, s.search_ms) as median_ms
from searched s left join confirmed c using (run_id, shape, attempt_id);

-- Per run and generation: spend so far and the best score so far (kernel_scores: a kernel's
-- geometric mean over the searched shapes, not the fastest single shape).
create or replace view convergence as
with gen as (
    select run_id, generation,
           count(*)                                 as attempts,
           sum(gpu_seconds)                         as gpu_seconds,
           sum(prompt_tokens + completion_tokens)   as tokens
    from attempts group by run_id, generation
), best as (
    select run_id, generation, min(score_ms) as gen_best_ms, any_value(basis) as basis
    from kernel_scores group by run_id, generation
)
select g.run_id, g.generation, g.attempts, g.gpu_seconds, g.tokens,
       b.gen_best_ms,
       min(b.gen_best_ms) over w as best_ms_so_far,
       sum(g.gpu_seconds) over w as cum_gpu_seconds,
       sum(g.tokens) over w      as cum_tokens
from gen g left join best b using (run_id, generation)
window w as (partition by g.run_id order by g.generation
             rows between unbounded preceding and current row)
order by g.run_id, g.generation;

-- Each baseline of a run scored as kernel_scores scores the run's kernels: the geometric mean of its medians
-- over the searched shapes (held-out rows apart), where it is correct and timed on every one of them, else
-- (no GPU) the cost model's geometric mean over the shapes it was predicted on.
create or replace view baseline_scores as
with searched as (
    select run_id, count(distinct shape) as n_shapes from baselines where role <> 'held_out' group by run_id
)
select b.run_id, b.name, b.source,
       case when count(b.median_ms) = s.n_shapes and bool_and(coalesce(b.correct, false)) then 'measured'
            when count(b.predicted_ms) > 0 then 'predicted' end as basis,
       case when count(b.median_ms) = s.n_shapes and bool_and(coalesce(b.correct, false))
            then exp(avg(ln(b.median_ms)))
            when count(b.predicted_ms) > 0 then exp(avg(ln(b.predicted_ms))) end as score_ms,
       bool_and(b.correct) as correct      -- NULL: checked nowhere
from baselines b join searched s using (run_id)
where b.role <> 'held_out'
group by b.run_id, b.name, b.source, s.n_shapes;
