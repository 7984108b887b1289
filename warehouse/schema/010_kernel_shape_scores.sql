-- Cake warehouse, schema version 10: scores per (kernel, shape, GPU model) across every run and shape set.
--
-- A portfolio is searched by several runs (one per region, each on a shape set of its own), and a kernel found
-- by one run may be measured again by another (a confirmation, a held-out row, a later sweep). leaderboard keeps
-- a best per shape set; these views keep, per problem, shape and GPU model, every kernel (by IR hash) with its
-- best correct median over all runs (cold L2, CUDA events; a winner that failed its confirmation is left out),
-- and the fastest of them. The measurement kinds a score comes from are listed: `held_out` among them means
-- the row is a held-out row of some run, which no search was steered by.

create or replace view kernel_shape_scores as
select a.problem, m.shape, m.gpu_model, a.ir_hash,
       min(m.median_ms)                                    as best_ms,
       arg_min(m.attempt_id, m.median_ms)                  as attempt_id,
       arg_min(a.run_id, m.median_ms)                      as run_id,
       count(distinct a.run_id)                            as runs,
       count(*)                                            as measurements,
       list(distinct m.kind order by m.kind)               as kinds
from measurements m
join attempts a using (attempt_id)
where m.correct and m.timer = 'cuda_event' and starts_with(m.l2, 'cold')     -- cold-clean (a read) or cold (a write)
  and m.attempt_id not in (select attempt_id from confirm_failures)
group by a.problem, m.shape, m.gpu_model, a.ir_hash;

create or replace view shape_best_any_run as
select * from kernel_shape_scores
qualify row_number() over (partition by problem, shape, gpu_model order by best_ms, ir_hash) = 1;
