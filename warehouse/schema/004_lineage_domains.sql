-- Cake warehouse, schema version 4: lineage, tactic refusals, kernel domains, and a kernel's score over the
-- headline shapes it handles.
--
-- A kernel may handle only some of a run's shapes (its domain: TMA's 16-byte strides, a bounded D or k):
-- the shapes outside it are refused before any launch (attempts.outside), neither wrong nor measured. A
-- kernel's score is the geometric mean of its search medians over the run's headline shapes, and it is
-- scored only when it was measured correct on every headline shape of the run; tails are measured (and must
-- be correct where the domain holds) but decide no ranking; held-out rows never count. Where a shape set
-- marks no headline row, every searched shape is a headline.

alter table attempts add column lineage VARCHAR[];   -- every step's tactics since the seed ('+'-joined per step)
alter table attempts add column outside VARCHAR[];   -- shapes of the run outside the kernel's domain

-- A tactic whose precondition did not hold for a parent, with its reason (one row per tactic and parent
-- and generation in which the agent drew it).
create table tactic_refusals (
    run_id      VARCHAR   NOT NULL,
    generation  INTEGER   NOT NULL,
    tactic      VARCHAR   NOT NULL,
    parent_hash VARCHAR   NOT NULL,
    reason      VARCHAR   NOT NULL,
    recorded_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- The shapes each run ranks its kernels on: the searched shapes whose role in the run's shape set is
-- headline (all of them where the set marks none, or where the warehouse holds no role for them).
create or replace view run_headlines as
with searched as (
    select distinct run_id, shape from measurements where kind = 'search'
), roles as (
    select s.run_id, s.shape, coalesce(sh.role, 'headline') as role
    from searched s
    left join runs_latest r using (run_id)
    left join (select distinct shape_set, problem, shape, role from shapes) sh
           on sh.shape_set = r.shape_set and sh.problem = r.problem and sh.shape = s.shape
), marked as (
    select run_id, bool_or(role = 'headline') as has_headline from roles group by run_id
)
select r.run_id, r.shape from roles r join marked m using (run_id)
where r.role = 'headline' or (not m.has_headline and r.role <> 'held_out');

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
from scored s left join attempts a using (attempt_id);
