-- Cake warehouse, schema version 8: the hand-written kernels and the peers are scored on the shapes the run's
-- kernels are scored on.
--
-- kernel_scores takes the geometric mean over the run's headline shapes; baseline_scores took it over every
-- searched shape, tails included. A hand-written kernel whose domain leaves out a tail shape (a TMA kernel
-- on a ragged D) was then never 'measured' and showed the cost model's figure beside the run's measured best,
-- although it was timed on every headline shape in the same run. Now a baseline's score is the geometric mean
-- of its medians over the run's headline shapes (its 'headline' rows; every row but the held-out ones where the
-- run has no headline row), 'measured' when it was measured correct on each of them.

create or replace view baseline_scores as
with rows_in as (
    select b.*, bool_or(b.role = 'headline') over (partition by b.run_id) as has_headline
    from baselines b
), scored_rows as (
    select * from rows_in
    where role = 'headline' or (not has_headline and role <> 'held_out')
), shapes_of_run as (
    select run_id, count(distinct shape) as n_shapes from scored_rows group by run_id
)
select b.run_id, b.name, b.source,
       case when count(b.median_ms) = s.n_shapes and bool_and(coalesce(b.correct, false)) then 'measured'
            when count(b.predicted_ms) > 0 then 'predicted' end as basis,
       case when count(b.median_ms) = s.n_shapes and bool_and(coalesce(b.correct, false))
            then exp(avg(ln(b.median_ms)))
            when count(b.predicted_ms) > 0 then exp(avg(ln(b.predicted_ms))) end as score_ms,
       bool_and(b.correct) as correct      -- NULL: checked nowhere
from scored_rows b join shapes_of_run s using (run_id)
group by b.run_id, b.name, b.source, s.n_shapes;
