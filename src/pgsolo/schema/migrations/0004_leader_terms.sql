-- When each leader's current term began (pgsolo.leader() and campaign() on a connection
-- pgsolo opened itself): PostgreSQL keeps no time at which a lock was granted, and a
-- candidate may have waited on its session for days, so the session's age says little.
-- One row per leader name, overwritten by each term as it begins. pid and backend_start
-- name the session that won the term (a pid alone may be reused): the monitor believes the
-- row only while that very session holds the name's key.
CREATE TABLE pgsolo.leader_terms (
    name          text PRIMARY KEY
                  CHECK (name <> '' AND octet_length(name) <= 512),
    token         bigint,
    pid           integer NOT NULL,
    backend_start timestamptz NOT NULL,
    started_at    timestamptz NOT NULL
);
