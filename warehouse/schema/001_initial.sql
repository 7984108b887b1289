-- Cake warehouse, schema version 1.
--
-- Tables are append-only: an update is a new row and a `*_latest` view picks
-- the current state. Each `create table` here is never materialised in a
-- database file: it only defines the Arrow schema of the table's Parquet
-- batches (NOT NULL = required column, DEFAULT = filled when a batch omits it).
-- Value checks (sets, ranges, p10 <= median <= p90) live in
-- warehouse/expectations.py and run through Great Expectations before landing.
-- Timestamps are naive UTC everywhere.
-- Views must be written `create or replace view` so later migrations can
-- redefine them.

-- ---------------------------------------------------------------- tables

create table runs (
    run_id          VARCHAR   NOT NULL,
    problem         VARCHAR   NOT NULL,
    shape_set       VARCHAR   NOT NULL,
    harness_version INTEGER   NOT NULL,
    agent           VARCHAR   NOT NULL,
    seed            INTEGER   NOT NULL,
    generations     INTEGER   NOT NULL,
    population      INTEGER   NOT NULL,
    host            VARCHAR   NOT NULL,
    gpu_model       VARCHAR,
    flow_run_id     VARCHAR,
    started_at      TIMESTAMP NOT NULL,
    status          VARCHAR   NOT NULL,  -- running | completed | failed | cancelled | crashed
    finished_at     TIMESTAMP,
    recorded_at     TIMESTAMP NOT NULL DEFAULT current_timestamp  -- orders status rows
);

create table attempts (
    attempt_id        VARCHAR   NOT NULL,
    run_id            VARCHAR   NOT NULL,
    generation        INTEGER   NOT NULL,
    problem           VARCHAR   NOT NULL,
    ir_hash           VARCHAR   NOT NULL,
    ir_text           VARCHAR   NOT NULL,
    parents           VARCHAR[],
    agent             VARCHAR   NOT NULL,
    tactic            VARCHAR,
    harness_version   INTEGER   NOT NULL,
    stage             VARCHAR   NOT NULL,  -- verify | compile | cost_filter | check | time
    outcome           VARCHAR   NOT NULL,  -- see expectations.OUTCOMES
    error_rule        VARCHAR,
    error_message     VARCHAR,
    signature         VARCHAR,             -- set for failures: the cluster key
    features          VARCHAR,             -- JSON text of IR features
    prompt_tokens     INTEGER   NOT NULL DEFAULT 0,
    completion_tokens INTEGER   NOT NULL DEFAULT 0,
    predicted_ms      DOUBLE,
    gpu_seconds       DOUBLE    NOT NULL DEFAULT 0,
    created_at        TIMESTAMP NOT NULL DEFAULT current_timestamp
);

create table diagnostics (
    attempt_id VARCHAR NOT NULL,
    rule       VARCHAR NOT NULL,
    severity   VARCHAR NOT NULL,  -- error | warning | hint
    message    VARCHAR NOT NULL,
    line       INTEGER,
    col        INTEGER,
    path       VARCHAR,
    hint       VARCHAR,
    witness    VARCHAR[]
);

create table compiles (
    attempt_id  VARCHAR NOT NULL,
    source_hash VARCHAR NOT NULL,
    arch        VARCHAR NOT NULL,
    seconds     DOUBLE  NOT NULL,
    registers   INTEGER,
    spill_bytes INTEGER,
    smem_bytes  INTEGER,
    barriers    INTEGER,
    cached      BOOLEAN NOT NULL,
    ok          BOOLEAN NOT NULL,
    log         VARCHAR
);

create table predictions (
    attempt_id    VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    shape         VARCHAR NOT NULL,
    predicted_ms  DOUBLE  NOT NULL
);

create table checks (
    attempt_id VARCHAR NOT NULL,
    shape      VARCHAR NOT NULL,
    backend    VARCHAR NOT NULL,  -- interpreter | gpu
    correct    BOOLEAN NOT NULL,
    max_error  DOUBLE,
    message    VARCHAR
);

create table measurements (
    attempt_id  VARCHAR   NOT NULL,
    run_id      VARCHAR   NOT NULL,
    shape       VARCHAR   NOT NULL,
    gpu_model   VARCHAR   NOT NULL,
    timer       VARCHAR   NOT NULL DEFAULT 'cuda_event',
    l2          VARCHAR   NOT NULL,  -- cold | warm
    median_ms   DOUBLE    NOT NULL,
    p10_ms      DOUBLE    NOT NULL,
    p90_ms      DOUBLE    NOT NULL,
    runs        INTEGER   NOT NULL,
    correct     BOOLEAN   NOT NULL,
    max_error   DOUBLE,
    kind        VARCHAR   NOT NULL,  -- search | confirm
    measured_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);

create table shapes (
    shape_set VARCHAR NOT NULL,
    problem   VARCHAR NOT NULL,
    shape     VARCHAR NOT NULL,  -- canonical key, e.g. 'M=128,N=96,K=64'
    dims      VARCHAR NOT NULL,  -- JSON
    role      VARCHAR NOT NULL   -- headline | tail | held_out
);

create table proposals (
    proposal_id  VARCHAR   NOT NULL,
    kind         VARCHAR   NOT NULL,  -- rule | primitive | calibration | tactic
    signature    VARCHAR,             -- the failure cluster it came from
    title        VARCHAR   NOT NULL,
    evidence     VARCHAR   NOT NULL,  -- JSON
    payload      VARCHAR   NOT NULL,  -- JSON
    gate_report  VARCHAR,             -- JSON
    flow_run_id  VARCHAR,
    base_version INTEGER   NOT NULL,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp,
    recorded_at  TIMESTAMP NOT NULL DEFAULT current_timestamp  -- orders re-filed rows
);

create table decisions (
    proposal_id VARCHAR   NOT NULL,
    decision    VARCHAR   NOT NULL,  -- approved | rejected
    reason      VARCHAR   NOT NULL,
    decided_by  VARCHAR   NOT NULL,
    decided_at  TIMESTAMP NOT NULL DEFAULT current_timestamp,
    new_version INTEGER
);

create table harness_versions (
    version     INTEGER   NOT NULL,
    parent      INTEGER,
    proposal_id VARCHAR,
    spec        VARCHAR   NOT NULL,  -- JSON
    created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

create table dispatch (
    problem    VARCHAR   NOT NULL,
    shape_set  VARCHAR   NOT NULL,
    shape      VARCHAR   NOT NULL,
    attempt_id VARCHAR   NOT NULL,
    ir_hash    VARCHAR   NOT NULL,
    median_ms  DOUBLE    NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- ---------------------------------------------------------------- views

-- Current state of each run: a finished status beats 'running', then the
-- latest recorded row wins.
create or replace view runs_latest as
select * from runs
qualify row_number() over (
    partition by run_id
    order by (status <> 'running') desc, recorded_at desc, finished_at desc nulls last
) = 1;

-- Each proposal's latest row joined with its latest decision.
create or replace view proposals_latest as
with p as (
    select * from proposals
    qualify row_number() over (partition by proposal_id order by recorded_at desc) = 1
), d as (
    select * from decisions
    qualify row_number() over (partition by proposal_id order by decided_at desc) = 1
)
select p.*,
       coalesce(d.decision, 'pending') as status,
       d.reason, d.decided_by, d.decided_at, d.new_version
from p left join d using (proposal_id);

-- Attempts that failed ('filtered' is the cost filter's choice, not a failure).
create or replace view failures as
select attempt_id, run_id, generation, problem, agent, tactic, harness_version,
       stage, outcome, error_rule as rule, error_message,
       coalesce(signature, stage || ':' || coalesce(error_rule, outcome)) as signature,
       gpu_seconds, created_at
from attempts
where outcome in ('verify_failed', 'compile_failed', 'wrong', 'runtime_fault', 'timeout');

create or replace view failure_clusters as
select signature, stage, rule,
       count(*)                                           as n_attempts,
       count(distinct run_id)                             as n_runs,
       count(distinct problem)                            as n_problems,
       min(created_at)                                    as first_seen,
       max(created_at)                                    as last_seen,
       list(attempt_id order by created_at desc)[1:5]     as sample_attempt_ids,
       sum(gpu_seconds)                                   as gpu_seconds
from failures
group by signature, stage, rule
order by n_attempts desc, gpu_seconds desc;

create or replace view failure_history as
select cast(date_trunc('day', created_at) as date) as day, stage, rule,
       count(*) as n_attempts, sum(gpu_seconds) as gpu_seconds
from failures
group by all
order by day, n_attempts desc;

-- Best correct median per problem, shape set, shape and GPU model.
create or replace view leaderboard as
select a.problem, r.shape_set, m.shape, m.gpu_model,
       m.median_ms as best_ms, m.p10_ms, m.p90_ms, m.kind,
       m.attempt_id, a.ir_hash, a.run_id, m.measured_at
from measurements m
join attempts a using (attempt_id)
join runs_latest r on r.run_id = a.run_id
where m.correct
qualify row_number() over (
    partition by a.problem, r.shape_set, m.shape, m.gpu_model
    order by m.median_ms, m.measured_at
) = 1;

-- Per run and generation: spend so far and the best median so far. The median
-- is the minimum over all shapes of the run (not a geomean).
create or replace view convergence as
with gen as (
    select run_id, generation,
           count(*)                                 as attempts,
           sum(gpu_seconds)                         as gpu_seconds,
           sum(prompt_tokens + completion_tokens)   as tokens
    from attempts group by run_id, generation
), best as (
    select a.run_id, a.generation, min(m.median_ms) as gen_best_ms
    from measurements m join attempts a using (attempt_id)
    where m.correct
    group by a.run_id, a.generation
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

create or replace view cost_model_error as
select p.attempt_id, a.problem, p.shape, p.model_version, m.gpu_model, m.l2, m.kind,
       p.predicted_ms, m.median_ms as measured_ms,
       p.predicted_ms / m.median_ms         as ratio,
       abs(ln(p.predicted_ms / m.median_ms)) as abs_log_error
from predictions p
join measurements m on m.attempt_id = p.attempt_id and m.shape = p.shape
left join attempts a on a.attempt_id = p.attempt_id;

-- Per verifier rule (error severity): attempts it flagged and attempts it stopped.
create or replace view rule_hits as
-- GPU time a rule saved: each attempt it stopped before the GPU is charged the mean GPU
-- seconds that attempts of the same problem spent once they reached the GPU (an estimate).
with gpu_cost as (
    select problem, avg(gpu_seconds) as mean_gpu_s
    from attempts where gpu_seconds > 0 group by problem
), hits as (
    select rule, attempt_id, count(*) as n_diag
    from diagnostics where severity = 'error' group by rule, attempt_id
)
select h.rule,
       sum(h.n_diag)                                                as n_diagnostics,
       count(*)                                                     as n_attempts,
       count(*) filter (where a.outcome = 'verify_failed')          as n_stopped,
       coalesce(sum(g.mean_gpu_s) filter (where a.outcome = 'verify_failed'), 0) as est_gpu_seconds_saved,
       min(a.created_at)                                            as first_seen,
       max(a.created_at)                                            as last_seen
from hits h
left join attempts a using (attempt_id)
left join gpu_cost g on g.problem = a.problem
group by h.rule
order by n_stopped desc, n_attempts desc;
