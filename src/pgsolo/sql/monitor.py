"""The monitor's queries: ``pgsolo locks``, ``pgsolo doctor``, ``pgsolo terminate``."""

from __future__ import annotations

from ..keys import ONCE_PREFIX, Key, encode_pg_lock
from .locks import IN_RECOVERY, derived_int64
from .schema import table_usable
from .text import sql_literal, utf8

__all__ = [
    "ADVISORY_LOCK_FUNCTIONS_PATTERN",
    "CLEAR_ACTIVITY_SNAPSHOT",
    "DOCTOR",
    "LEDGER_KEYS",
    "MONITOR_QUERY_CHARS",
    "OPERATIONS_LISTED",
    "advisory_locks",
    "operations",
    "terminate_backend",
]


# pg_stat_activity is read once per transaction and cached; clearing the cache first
# makes it newer than the pg_locks snapshot of the next statement, even inside a
# transaction the caller has open (the monitor's session-lifetime rule depends on it).
CLEAR_ACTIVITY_SNAPSHOT = "SELECT pg_stat_clear_snapshot()"


# The current query is cut to this many characters on the server: enough for a keeper's
# beat (about 320, sql.keeper_beat) to be recognised whole, key included, by the monitor.
MONITOR_QUERY_CHARS = 400


_ADVISORY_IN_THIS_DATABASE = (
    "locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def advisory_locks(*, key: Key | None = None, pid: int | None = None) -> str:
    """Every advisory lock of the current database, held and waiting, as one JSON object
    (:func:`utf8`: other sessions' queries can hold any character).

    ``locks`` is compact (one array per row, 10,000 rows stay small); ``sessions`` has
    one entry per backend that appears there. ``pg_locks`` is read first, in full (its
    function copies the lock table at its first row); ``pg_stat_get_activity`` is called
    only after, per distinct pid, so what it says about a backend is no older than the
    lock snapshot, and ``seen_after`` (the statement's start) is older than both.
    """
    filters = ""
    if key is not None:
        classid, objid, objsubid = encode_pg_lock(key)
        filters += f" AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
    if pid is not None:
        filters += f" AND pid = {int(pid)}"
    locks = (
        "WITH l AS MATERIALIZED (SELECT pid, classid::bigint AS classid,"
        " objid::bigint AS objid, objsubid::int AS objsubid, mode = 'ShareLock' AS shared,"
        " granted, waitstart FROM pg_locks"
        f" WHERE {_ADVISORY_IN_THIS_DATABASE}{filters})"
    )
    snapshot = (
        "json_build_object("
        "'seen_after', statement_timestamp(), 'now', clock_timestamp(),"
        " 'database', current_database(),"
        # Whether pgsolo's ledger exists and may be read (it names the keys of its jobs),
        # and its record of leaders' terms (when they began): only niceties.
        f" 'ledger', {table_usable('pgsolo.job_runs')},"
        f" 'leader_terms', {table_usable('pgsolo.leader_terms')},"
        " 'locks', coalesce((SELECT json_agg(json_build_array(pid, classid, objid, objsubid,"
        " shared, granted, waitstart,"
        " CASE WHEN granted THEN NULL ELSE pg_blocking_pids(pid) END)) FROM l), '[]'::json),"
        " 'sessions', coalesce((SELECT json_object_agg(a.pid, json_build_object("
        "'application_name', a.application_name, 'client_addr', host(a.client_addr),"
        " 'client_port', a.client_port, 'state', a.state, 'backend_start', a.backend_start,"
        " 'xact_start', a.xact_start, 'query_start', a.query_start,"
        " 'state_change', a.state_change,"
        # A snapshot or a transaction id: what holds back VACUUM, since xact_start at most.
        " 'holds_horizon', a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL,"
        f" 'query', left(a.query, {int(MONITOR_QUERY_CHARS)})))"
        " FROM (SELECT DISTINCT pid FROM l WHERE pid IS NOT NULL) p,"
        " LATERAL pg_stat_get_activity(p.pid) a), '{}'::json))"
    )
    return f"{locks} SELECT {utf8(snapshot)}"


LEDGER_JOBS = 1000  # the most distinct jobs LEDGER_KEYS reads


# The key each job of the ledger last ran with, as {"<key text>": "<job>"}. One index probe
# per distinct job (a loose scan of job_runs_job_started_at), never a scan of the ledger.
LEDGER_KEYS = "SELECT " + utf8(
    "coalesce((SELECT json_object_agg(lock_key, job) FROM (SELECT DISTINCT ON (k.lock_key)"
    " k.lock_key, j.job FROM (WITH RECURSIVE jobs(job) AS ("
    "(SELECT job FROM pgsolo.job_runs ORDER BY job LIMIT 1) UNION ALL"
    " SELECT (SELECT r.job FROM pgsolo.job_runs r WHERE r.job > jobs.job ORDER BY r.job"
    f" LIMIT 1) FROM jobs WHERE jobs.job IS NOT NULL) SELECT job FROM jobs"
    f" WHERE job IS NOT NULL LIMIT {LEDGER_JOBS}) j,"
    " LATERAL (SELECT lock_key, started_at FROM pgsolo.job_runs r WHERE r.job = j.job"
    " ORDER BY started_at DESC LIMIT 1) k ORDER BY k.lock_key, k.started_at DESC) x),"
    " '{}'::json)"
)


# The functions that take an advisory lock (not the unlocks): who may call them can
# hold any key and starve a job.
ADVISORY_LOCK_FUNCTIONS_PATTERN = "^pg_(try_)?advisory_(xact_)?lock(_shared)?$"


# The current query doctor shows of a session that holds back VACUUM: enough to know it.
HORIZON_QUERY_CHARS = 80


_DOCTOR_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout")


_DOCTOR_LOCKS = (
    "WITH l AS MATERIALIZED (SELECT pid, granted, database"
    " = (SELECT oid FROM pg_database WHERE datname = current_database()) AS here,"
    " waitstart FROM pg_locks WHERE locktype = 'advisory')"
)


_DOCTOR_SNAPSHOT = (
    "json_build_object("
    "'now', statement_timestamp(), 'database', current_database(),"
    f" 'user', current_user, 'in_recovery', {IN_RECOVERY},"
    " 'settings', (SELECT json_object_agg(name, json_build_object("
    "'ms', setting::bigint, 'source', source))"
    " FROM pg_settings WHERE name IN ("
    + ", ".join(f"'{name}'" for name in _DOCTOR_SETTINGS)
    + ")),"
    " 'role_settings', coalesce((SELECT json_agg(json_build_object("
    "'role', coalesce(r.rolname, 'every role'), 'database', coalesce(d.datname, 'every database'),"
    " 'setting', c.setting) ORDER BY r.rolname NULLS FIRST, d.datname NULLS FIRST)"
    " FROM pg_db_role_setting s CROSS JOIN LATERAL unnest(s.setconfig) AS c(setting)"
    " LEFT JOIN pg_roles r ON r.oid = s.setrole LEFT JOIN pg_database d ON d.oid = s.setdatabase"
    " WHERE (d.datname IS NULL OR d.datname = current_database())"
    " AND split_part(c.setting, '=', 1) IN ("
    + ", ".join(f"'{name}'" for name in _DOCTOR_SETTINGS)
    + ")), '[]'::json),"
    " 'capacity', json_build_object("
    "'max_locks_per_transaction', current_setting('max_locks_per_transaction')::int,"
    " 'max_connections', current_setting('max_connections')::int,"
    " 'max_prepared_transactions', current_setting('max_prepared_transactions')::int,"
    " 'advisory', (SELECT count(*) FROM l),"
    " 'all', (SELECT count(*) FROM pg_locks WHERE NOT fastpath)),"
    " 'public_execute', coalesce((SELECT json_agg(p.oid::regprocedure::text ORDER BY 1)"
    " FROM pg_proc p WHERE p.pronamespace = 'pg_catalog'::regnamespace"
    f" AND p.proname ~ '{ADVISORY_LOCK_FUNCTIONS_PATTERN}'"
    " AND has_function_privilege('public', p.oid, 'EXECUTE')), '[]'::json),"
    " 'sessions', coalesce((SELECT json_agg(json_build_object("
    "'pid', p.pid, 'held', p.held, 'waiting', p.waiting, 'waiting_since', p.waiting_since,"
    " 'application_name', a.application_name, 'client_addr', host(a.client_addr),"
    " 'state', a.state, 'xact_start', a.xact_start, 'state_change', a.state_change,"
    " 'backend_start', a.backend_start,"
    # A wait whose own statement sets lock_timeout (pgsolo's do) is bounded.
    " 'bounded_wait', a.query ILIKE '%lock_timeout%')"
    " ORDER BY p.pid)"
    " FROM (SELECT pid, count(*) FILTER (WHERE granted) AS held,"
    " count(*) FILTER (WHERE NOT granted) AS waiting,"
    " min(waitstart) FILTER (WHERE NOT granted) AS waiting_since"
    " FROM l WHERE here AND pid IS NOT NULL GROUP BY pid) p,"
    " LATERAL pg_stat_get_activity(p.pid) a), '[]'::json),"
    # Every client session of this database with a transaction open that holds back
    # VACUUM (a snapshot, backend_xmin, or a transaction id, backend_xid) or sits idle in
    # it, advisory locks or not: doctor judges their age.
    " 'horizon', coalesce((SELECT json_agg(json_build_object("
    "'pid', a.pid, 'application_name', a.application_name,"
    " 'client_addr', host(a.client_addr), 'state', a.state, 'xact_start', a.xact_start,"
    " 'holds', CASE WHEN a.backend_xid IS NOT NULL THEN 'a transaction id'"
    " WHEN a.backend_xmin IS NOT NULL THEN 'a snapshot' END,"
    f" 'query', left(a.query, {int(HORIZON_QUERY_CHARS)})) ORDER BY a.xact_start, a.pid)"
    " FROM pg_stat_activity a WHERE a.datname = current_database()"
    " AND a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()"
    " AND a.xact_start IS NOT NULL AND (a.backend_xmin IS NOT NULL"
    " OR a.backend_xid IS NOT NULL OR a.state LIKE 'idle in transaction%')), '[]'::json))"
)


# One JSON object (utf8(): role and database names can hold any character).
DOCTOR = f"{_DOCTOR_LOCKS} SELECT {utf8(_DOCTOR_SNAPSHOT)}"


def terminate_backend(pid: int, *, wait_ms: int, only_holding: bool = False) -> str:
    """End backend ``pid`` and wait up to ``wait_ms`` for it to be gone (true if it is);
    ``only_holding``: only if it holds an advisory lock in this database as the statement
    runs (no row otherwise)."""
    terminate = f"SELECT pg_terminate_backend({int(pid)}, {int(wait_ms)})"
    if not only_holding:
        return terminate
    return (
        f"{terminate} WHERE EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
        f" AND granted AND pid = {int(pid)}"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
    )


OPERATIONS_LISTED = 200  # the most operations the dashboard lists (the order: operations())

# The int64 keys of the advisory locks granted in this database, as pg_locks splits them.
_HELD_INT64_KEYS = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def operations(*, limit: int = OPERATIONS_LISTED) -> str:
    """The latest operations of ``run_once`` (``pgsolo.operations``) as one JSON object
    with the server's ``now`` (:func:`utf8`: an operation key can hold any character).
    A ``started`` one says whether its holder is alive (``holder_alive``: its lock is
    held). The ``started`` ones come first, and of those first the ones whose holder is
    gone, which a list cut at ``limit`` must not leave out; then the newest. An error is
    cut to its first 200 characters; the result is left out (it may be a megabyte)."""
    alive = (
        "CASE WHEN state = 'started' THEN"
        f" {derived_int64(sql_literal(ONCE_PREFIX) + ' || op_key')} IN ({_HELD_INT64_KEYS})"
        " END"
    )
    listed = (
        "SELECT op_key, state, attempts, holder_pid, host, pid, created_at, updated_at,"
        f" finished_at, left(error, 200) AS error, {alive} AS holder_alive"
        " FROM pgsolo.operations"
    )
    order = "state <> 'started', holder_alive, updated_at DESC"
    snapshot = (
        "json_build_object('now', clock_timestamp(), 'operations', coalesce(json_agg(o"
        f" ORDER BY {order}), '[]'::json))"
    )
    return f"SELECT {utf8(snapshot)} FROM ({listed} ORDER BY {order} LIMIT {int(limit)}) o"
