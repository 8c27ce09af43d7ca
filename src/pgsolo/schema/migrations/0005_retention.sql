-- Retention (pgsolo prune): what it deletes is found by age, oldest first, a batch at a
-- time; without these indexes each batch would scan the whole table (10 million ledger
-- rows: seconds per batch, each batch a snapshot that holds back VACUUM meanwhile).
CREATE INDEX job_runs_finished_at ON pgsolo.job_runs (finished_at);
CREATE INDEX job_periods_completed_at ON pgsolo.job_periods (completed_at);
-- Only finished operations are ever pruned: a started one is an attempt that may be
-- running, or that crashed and waits for the next caller to take it over.
CREATE INDEX operations_finished_at ON pgsolo.operations (finished_at)
    WHERE state <> 'started';
