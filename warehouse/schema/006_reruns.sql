-- Cake warehouse, schema version 6: work re-run after its GPU worker was lost.
--
-- The (candidate, shape) jobs of a batch go back to the queue when the worker that held them dies, outlives
-- its watchdog, raises, or asks to be replaced after an earlier job of the batch poisoned it; a job alone on a
-- worker whose Ray node went away goes back too. Each is run again on another worker (the replacement or any
-- other), and each time one row lands here, from the flow process, beside the job's one answer in checks and
-- measurements.
create table reruns (
    run_id      VARCHAR   NOT NULL,
    session     INTEGER   NOT NULL,   -- the job of the run (0, then +1 per --resume)
    generation  INTEGER   NOT NULL,   -- -1: the final stage
    kind        VARCHAR   NOT NULL,   -- search | strict | confirm | held_out | baseline: what the job ran
    attempt_id  VARCHAR   NOT NULL,
    shape       VARCHAR   NOT NULL,
    cause       VARCHAR   NOT NULL,   -- died | timeout | raised | restart | node_lost
    node_id     VARCHAR,              -- the Ray node of the lost worker (NULL: it never answered)
    pid         INTEGER,              -- its process
    message     VARCHAR,
    recorded_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);
