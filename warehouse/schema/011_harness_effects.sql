-- Cake warehouse, schema version 11: what each approved harness change did from the version it made on.
--
-- One row per harness version made by an approved proposal (`harness_versions` joined with `proposals_latest`),
-- with the record of its kind, over every run of the warehouse (all problems) under that version or a later one:
--
--   rule         stopped:   candidates the rule refused at verify (their error_rule is the rule's id), which
--                           never reached the compiler or the GPU;
--                gpu_s_saved: stopped x what a failure of the rule's cluster cost on the GPU before the rule
--                           (the mean gpu_seconds of the attempts with the proposal's signature that failed on the
--                           GPU under an earlier version; where this warehouse has none, as in a fresh run under a
--                           harness learned elsewhere, the cluster's GPU-seconds per attempt recorded in the
--                           proposal's evidence where it was mined): an estimate, 0 where no such failure was timed;
--   primitive    used:      attempts whose text calls the composite; winners: those that are their run's best;
--   tactic       used:      attempts whose lineage took the macro (a step of it, or of an ancestor's);
--                winners:   those that are their run's best;
--   calibration  ranked:    attempts the refitted model ranked (a prediction under the version);
--                predictions_changed: the held-out predictions the refit changed when it was judged.

create or replace view harness_effects as
with changes as (
    select v.version, v.parent, v.proposal_id, v.created_at, p.kind, p.title, p.signature, p.payload,
           p.evidence,
           case p.kind
               when 'rule' then json_extract_string(p.payload, '$.id')
               when 'primitive' then json_extract_string(p.payload, '$.composite.name')
               when 'tactic' then json_extract_string(p.payload, '$.macro.name')
           end as name
    from harness_versions v join proposals_latest p using (proposal_id)
),
later as (
    select c.version as change_version, a.*
    from changes c join attempts a on a.harness_version >= c.version
),
best as (select attempt_id from run_best),
here as (
    select c.version, avg(a.gpu_seconds) as gpu_s
    from changes c join attempts a
      on a.signature = c.signature and a.harness_version < c.version
     and a.outcome in ('wrong', 'runtime_fault', 'timeout') and a.gpu_seconds > 0
    group by c.version
),
cost as (
    -- this warehouse's own failures of the cluster first; else the cluster's cost where the rule was mined (the
    -- proposal's evidence: its GPU-seconds over its attempts), e.g. a harness carried to a fresh warehouse
    select c.version, coalesce(h.gpu_s,
           try_cast(json_extract(c.evidence, '$.cluster.gpu_seconds') as double)
           / nullif(try_cast(json_extract(c.evidence, '$.cluster.n_attempts') as double), 0)) as gpu_s
    from changes c left join here h using (version)
)
select c.version, c.parent, c.kind, c.name, c.title, c.created_at as approved_at,
       case when c.kind = 'rule' then (select count(*) from later l
                                        where l.change_version = c.version and l.error_rule = c.name) end
           as stopped,
       case when c.kind = 'rule' then coalesce((select count(*) from later l
                                                 where l.change_version = c.version and l.error_rule = c.name)
                                               * (select gpu_s from cost where cost.version = c.version), 0.0) end
           as gpu_s_saved,
       case when c.kind = 'primitive' then (select count(*) from later l where l.change_version = c.version
                                             and contains(l.ir_text, c.name || '('))
            when c.kind = 'tactic' and c.name is not null then (
                select count(*) from later l where l.change_version = c.version
                  and contains('+' || array_to_string(coalesce(l.lineage, []), '+') || '+', '+' || c.name || '+')) end
           as used,
       case when c.kind = 'primitive' then (select count(*) from later l where l.change_version = c.version
                                             and contains(l.ir_text, c.name || '(')
                                             and l.attempt_id in (select attempt_id from best))
            when c.kind = 'tactic' and c.name is not null then (
                select count(*) from later l where l.change_version = c.version
                  and contains('+' || array_to_string(coalesce(l.lineage, []), '+') || '+', '+' || c.name || '+')
                  and l.attempt_id in (select attempt_id from best)) end
           as winners,
       case when c.kind = 'calibration' then (select count(*) from later l where l.change_version = c.version
                                               and l.predicted_ms is not null) end
           as ranked,
       case when c.kind = 'calibration'
            then try_cast(json_extract(c.evidence, '$.judged_on_held_out.predictions_changed') as integer) end
           as predictions_changed
from changes c
order by c.version;
