-- The ledger of job attempts (pgsolo run --record, record=True) and the once-per-period
-- records (--once-per, period=), whose primary key makes a second run in a period lose.
CREATE TABLE pgsolo.job_runs (
    id               bigserial PRIMARY KEY,
    job              text NOT NULL,
    lock_key         text NOT NULL,
    outcome          text NOT NULL
                     CHECK (outcome IN ('completed', 'skipped', 'failed', 'lost')),
    reason           text,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    duration_ms      double precision NOT NULL,
    lock_wait_ms     double precision NOT NULL,
    host             text NOT NULL,
    pid              integer NOT NULL,
    backend_pid      integer,
    application_name text,
    exit_code        integer,
    error            text
);
CREATE INDEX job_runs_job_started_at ON pgsolo.job_runs (job, started_at DESC);
CREATE TABLE pgsolo.job_periods (
    job          text NOT NULL,
    period       text NOT NULL,
    period_start timestamptz NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    host         text,
    pid          integer,
    PRIMARY KEY (job, period, period_start)
);
