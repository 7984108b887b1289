-- Cake warehouse, schema version 7: a winner that comes out wrong when the final stage confirms it wins nothing.
--
-- The final stage re-measures each searched shape's winner (shape_best) on fresh inputs. Every verdict of that
-- confirmation lands in checks with kind 'confirm' (checks.kind: search | strict | held_out | confirm), beside the
-- measurement rows of the correct ones. A kernel wrong or faulting there on any shape passed the search's gate on
-- one draw of inputs and failed on another (a race, an uninitialised read): it is scored nowhere, so it is neither
-- a shape's winner, nor the run's best, nor a parent, nor on the leaderboard; the next fastest correct kernel takes
-- its place.

-- Every (kernel, shape) that came out wrong (or faulted) when the final stage confirmed it.
create or replace view confirm_failures as
select a.run_id, c.attempt_id, c.shape, c.backend, c.max_error, c.message
from checks c join attempts a using (attempt_id)
where c.kind = 'confirm' and not c.correct;

-- As in 004 (the geometric mean over the run's headline shapes, or the cost model's figure), without the
-- kernels in confirm_failures.
create or replace view kernel_scores as
with searched as (
    select m.run_id, m.attempt_id, m.shape, m.median_ms
    from measurements m join run_headlines h on h.run_id = m.run_id and h.shape = m.shape
    where m.kind = 'search' and m.correct
), per_kernel as (
    select run_id, attempt_id, count(distinct shape) as n_shapes, exp(avg(ln(median_ms))) as score_ms
    from searched group by run_id, attempt_id
), run_shapes as (
    select run_id, count(distinct shape) as n_shapes from run_headlines group by run_id
), measured as (
    select s.run_id, s.attempt_id, 'measured' as basis, s.score_ms, s.n_shapes
    from per_kernel s join run_shapes r using (run_id)
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
from scored s left join attempts a using (attempt_id)
where s.attempt_id not in (select attempt_id from confirm_failures);

-- As in 003 (per run and searched shape, the fastest correct search median, with its confirmatory median where
-- the final stage re-measured it), without the kernels in confirm_failures: wrong on one shape, a kernel is
-- dropped on all of them.
create or replace view shape_best as
with searched as (
    select m.run_id, m.shape, m.attempt_id, m.median_ms as search_ms, a.ir_hash, a.generation, a.slot
    from measurements m left join attempts a using (attempt_id)
    where m.kind = 'search' and m.correct and m.attempt_id not in (select attempt_id from confirm_failures)
    qualify row_number() over (
        partition by m.run_id, m.shape order by m.median_ms, a.generation, a.slot, a.ir_hash) = 1
), confirmed as (
    select run_id, shape, attempt_id, min(median_ms) as confirm_ms
    from measurements where kind = 'confirm' and correct group by all
)
select s.run_id, s.shape, s.attempt_id, s.ir_hash, s.search_ms, c.confirm_ms,
       coalesce(c.confirm_ms, s.search_ms) as median_ms
from searched s left join confirmed c using (run_id, shape, attempt_id);

-- As in 001 (the best correct median per problem, shape set, shape and GPU model), without the kernels in
-- confirm_failures.
create or replace view leaderboard as
select a.problem, r.shape_set, m.shape, m.gpu_model,
       m.median_ms as best_ms, m.p10_ms, m.p90_ms, m.kind,
       m.attempt_id, a.ir_hash, a.run_id, m.measured_at
from measurements m
join attempts a using (attempt_id)
join runs_latest r on r.run_id = a.run_id
where m.correct and m.attempt_id not in (select attempt_id from confirm_failures)
qualify row_number() over (
    partition by a.problem, r.shape_set, m.shape, m.gpu_model
    order by m.median_ms, m.measured_at
) = 1;
