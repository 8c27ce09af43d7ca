-- Operation keys (pgsolo.run_once): one row per operation, whose state moves from
-- started to succeeded or failed. 'started' is committed before the side effect runs, so
-- a crash leaves a trace that the next caller takes over; 'attempts' fences a superseded
-- attempt out of recording its success.
CREATE TABLE pgsolo.operations (
    op_key          text PRIMARY KEY
                    CHECK (op_key <> '' AND octet_length(op_key) <= 512),
    state           text NOT NULL
                    CHECK (state IN ('started', 'succeeded', 'failed')),
    idempotency_key text NOT NULL,
    attempts        integer NOT NULL CHECK (attempts >= 1),
    result          jsonb,
    error           text,
    holder_pid      integer,
    host            text,
    pid             integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK ((state = 'succeeded') = (result IS NOT NULL)),
    CHECK ((state = 'started') = (finished_at IS NULL))
);
