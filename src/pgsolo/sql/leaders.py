"""The record of when each leader's term began (``pgsolo.leader_terms``), and its read by
the monitor: PostgreSQL keeps no time at which a lock was granted."""

from __future__ import annotations

from .schema import FEATURE_PRIVILEGES, table_usable
from .text import sql_text, utf8

__all__ = ["LEADER_TERMS", "record_term"]


# What writing a term needs: the "leader" feature's privileges on the table (ON CONFLICT DO
# UPDATE reads the row it updates).
_TERM_PRIVILEGES = tuple(FEATURE_PRIVILEGES["leader"][0][0].split(", "))


def record_term(name: str, token: int | None) -> str:
    """Record that the term of leader ``name`` (fencing ``token``, or None) begins now, on
    this session, named by its pid and ``backend_start`` (a pid alone may be reused).

    One statement that does nothing where the table is missing (a database migrated by an
    older pgsolo, or never) or the role may not write it: it asks first, and PL/pgSQL
    parses the INSERT only when it runs it, so no error reaches the server's log.
    """
    fencing = "NULL" if token is None else str(int(token))
    return (
        f"DO $pgsolo$BEGIN IF ({table_usable('pgsolo.leader_terms', _TERM_PRIVILEGES)}) THEN"
        " INSERT INTO pgsolo.leader_terms (name, token, pid, backend_start, started_at)"
        f" SELECT {sql_text(name)}, {fencing}, a.pid, a.backend_start, now()"
        " FROM pg_stat_get_activity(pg_backend_pid()) a"
        " ON CONFLICT (name) DO UPDATE SET token = excluded.token, pid = excluded.pid,"
        " backend_start = excluded.backend_start, started_at = excluded.started_at;"
        " END IF; END$pgsolo$"
    )


# The terms whose session still lives, as {"terms": [[pid, name, started_at], ...]}: a row
# whose pid now belongs to a later session (another backend_start) is not believed, nor
# one of a session whose start this role may not read (another role's, without
# pg_read_all_stats). Sent only where the monitor's snapshot found the table readable.
LEADER_TERMS = "SELECT " + utf8(
    "json_build_object('terms', coalesce((SELECT json_agg(json_build_array(t.pid, t.name,"
    " t.started_at)) FROM pgsolo.leader_terms t, LATERAL pg_stat_get_activity(t.pid) a"
    " WHERE a.backend_start = t.backend_start), '[]'::json))"
)
