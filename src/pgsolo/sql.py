"""Every SQL statement pgsolo sends, in one place.

Statements are plain ASCII text with no bind parameters so that several of them can
travel in one simple-query message (one round trip). That is safe because the only values
spliced in are Python ints validated by :class:`~pgsolo.keys.Key`, millisecond counts that
are ints by construction, period units from a fixed list, and text (job names, hosts,
error messages) written as hex digits by :func:`~pgsolo.literals.sql_text`, which no
session setting or client encoding can turn into a quote.

What comes back is independent of the client encoding too. The lock statements answer
with booleans and integers only. Every text or JSON answer (the proxy check's stamp, an
operation's row and result, the ledger, the monitor's snapshots, which carry other
sessions' queries) is sent as its UTF-8 bytes in a ``bytea`` (:func:`utf8`) and decoded in
Python (:func:`read_text`, :func:`read_json`): under ``SQL_ASCII`` psycopg would return
text as ``bytes``, under ``LATIN1`` the server would refuse a character that encoding
lacks, and psycopg reads JSON as UTF-8 whatever the encoding.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from .durations import check_seconds
from .errors import InvalidArgumentError
from .keys import Key, encode_pg_lock
from .literals import sql_text

Lifetime = Literal["xact", "session"]


def utf8(expression: str) -> str:
    """``expression`` (text, or anything with a text form such as json) as the ``bytea``
    of its UTF-8 bytes: the server sends those bytes as they are (hex digits, or escapes,
    in ASCII) whatever the connection's ``client_encoding``. Read it with
    :func:`read_text` or :func:`read_json`."""
    return f"convert_to(({expression})::text, 'UTF8')"


def read_text(value: object) -> str | None:
    """What a :func:`utf8` column came back as (bytes), as text; None stays None."""
    if value is None:
        return None
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected the bytes of a utf8() column, got {type(value).__name__}")
    # A database whose own encoding is SQL_ASCII may hold any bytes: show, never fail.
    return bytes(value).decode("utf-8", errors="replace")


def read_json(value: object) -> Any:
    """What a :func:`utf8` column of JSON came back as, parsed; None stays None."""
    text = read_text(value)
    return None if text is None else json.loads(text)


BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"

# Inside the caller's transaction, pgsolo's statements run in a savepoint: rolling back
# to it after an error or an interruption keeps the caller's transaction usable (and
# restores lock_timeout), while a session-level advisory lock survives the rollback
# (PostgreSQL: session locks ignore transaction semantics).
SAVEPOINT = "SAVEPOINT pgsolo_lock"
SAVEPOINT_UNDO = "ROLLBACK TO SAVEPOINT pgsolo_lock"
SAVEPOINT_RELEASE = "RELEASE SAVEPOINT pgsolo_lock"

SAVE_LOCK_TIMEOUT = (
    "SELECT set_config('pgsolo.lock_timeout_before_wait', current_setting('lock_timeout'), true)"
)
RESTORE_LOCK_TIMEOUT = (
    "SELECT set_config('lock_timeout', current_setting('pgsolo.lock_timeout_before_wait'), true)"
)

SQLSTATE_LOCK_NOT_AVAILABLE = "55P03"


def lock_function(lifetime: Lifetime, *, wait: bool, shared: bool) -> str:
    """The name of the advisory-lock function for these choices (the article's table)."""
    return (
        "pg_"
        + ("" if wait else "try_")
        + "advisory_"
        + ("xact_" if lifetime == "xact" else "")
        + "lock"
        + ("_shared" if shared else "")
    )


# -- standbys ------------------------------------------------------------------------
#
# Advisory locks are not WAL-logged: a hot standby grants them locally and no other
# server ever sees them, so every lock pgsolo takes is refused on a server in recovery.
# A server never goes into recovery while a session lives (only a restart does that),
# so a session lock checks once per connection, with the route (stamp_session); an xact
# lock, which a transaction pooler may send to another server each time, checks in the
# statement that takes it.

IN_RECOVERY = "pg_is_in_recovery()"
SQLSTATE_IN_RECOVERY = "PGSRC"  # raised by REFUSE_STANDBY; pgsolo's own code
REFUSE_STANDBY = (
    f"DO $pgsolo$BEGIN IF {IN_RECOVERY} THEN RAISE EXCEPTION USING"
    f" ERRCODE = '{SQLSTATE_IN_RECOVERY}',"
    " MESSAGE = 'pgsolo: this server is in recovery (a standby): no advisory lock here';"
    " END IF; END$pgsolo$"
)


FENCING_SEQUENCE = "pgsolo.fencing_token_seq"
# The token this session's last acquisition took, for a message whose last row is not
# the acquisition's own.
LAST_FENCING_TOKEN = f"SELECT currval('{FENCING_SEQUENCE}')"


def acquire(
    key: Key,
    lifetime: Lifetime,
    *,
    wait: bool,
    shared: bool,
    fencing: bool = False,
    refuse_standby: bool = False,
) -> str:
    """Take the lock: true/false for a try, true once granted for a wait. With
    ``fencing``, the lock and its token in one statement: the token (from 1 up) once
    granted, 0 for a busy try. The sequence never waits for anyone, and a statement
    that names it fails before it takes the lock when it does not exist.

    ``refuse_standby`` (tries only): NULL instead of taking the lock on a server in
    recovery. CASE tests its conditions in order, so the lock function is not called
    there; the check costs no round trip and leaves the caller's transaction usable.
    A wait is refused by :data:`REFUSE_STANDBY` before it instead."""
    call = f"{lock_function(lifetime, wait=wait, shared=shared)}({key.sql_args})"
    token = f"nextval('{FENCING_SEQUENCE}')"
    if wait:  # the waiting functions return void: as a subquery, a row once granted
        return f"SELECT (SELECT {token if fencing else 'true'} FROM {call})"
    standby = f"WHEN {IN_RECOVERY} THEN NULL " if refuse_standby else ""
    if fencing:
        return f"SELECT CASE {standby}WHEN {call} THEN {token} ELSE 0 END"
    if refuse_standby:
        return f"SELECT CASE {standby}ELSE {call} END"
    return f"SELECT {call}"


def unlock(key: Key, *, shared: bool) -> str:
    # Returns true, or false (with a server warning) when the key was not held.
    return f"SELECT pg_advisory_unlock{'_shared' if shared else ''}({key.sql_args})"


def set_local_lock_timeout(milliseconds: int) -> str:
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int) or milliseconds < 1:
        raise ValueError(f"lock_timeout must be a positive number of ms, got {milliseconds!r}")
    return f"SET LOCAL lock_timeout = '{milliseconds}ms'"


SQLSTATE_LOCK_GONE = "PGSLG"  # raised by assert_same_transaction; pgsolo's own code
XACT_MARKER_SETTING = "pgsolo.xact_lock_marker"


def mark_transaction(marker: str) -> str:
    """Mark the transaction that takes an xact lock (a transaction-local setting, gone
    when that transaction ends, exactly like the lock)."""
    return f"SELECT set_config('{XACT_MARKER_SETTING}', {_token_literal(marker)}, true)"


def assert_same_transaction(key: Key, marker: str, *, shared: bool) -> str:
    """Fail unless this backend still holds ``key``: sent in the same message as the
    COMMIT, so that work which ended the locked transaction and carried on in another is
    rolled back, not committed. A transaction-level lock can only go away with its
    transaction, so the marker of that transaction (:func:`mark_transaction`) answers
    without reading the whole shared lock table; only when the marker is gone (the work
    ended the transaction, or ran RESET ALL) is ``pg_locks`` asked."""
    return (
        # CASE, not AND: PostgreSQL does not promise to evaluate AND's sides in order,
        # and pg_locks must be read only when the marker is gone.
        # (In parentheses: PL/pgSQL's IF ends its condition at the first THEN outside them.)
        f"DO $pgsolo$BEGIN IF (CASE WHEN current_setting('{XACT_MARKER_SETTING}', true)"
        f" = {_token_literal(marker)} THEN false"
        f" ELSE NOT {_held_here_condition(key, shared=shared)} END) THEN"
        f" RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_LOCK_GONE}',"
        f" MESSAGE = 'pgsolo: advisory lock {key.text} is no longer held';"
        " END IF; END$pgsolo$"
    )


def held_here(key: Key, *, shared: bool) -> str:
    """Whether this backend holds ``key`` granted, according to ``pg_locks``."""
    return f"SELECT {_held_here_condition(key, shared=shared)}"


def _held_here_condition(key: Key, *, shared: bool) -> str:
    classid, objid, objsubid = encode_pg_lock(key)
    mode = "ShareLock" if shared else "ExclusiveLock"
    return (
        "EXISTS (SELECT 1 FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
        f" AND mode = '{mode}')"
    )


# -- which backend answers: proxies, the keeper ----------------------------------------
#
# A transaction-pooling proxy (PgBouncer pool_mode=transaction) hands each transaction of
# a client to whichever server connection is free, so a session lock stays on a backend
# the client no longer talks to. pgsolo stamps a session with a random token (a
# session-level setting) to see whether a second connection lands on it; statements
# meant for the session that holds a lock check its pid, and so does the keeper.

SESSION_STAMP_SETTING = "pgsolo.session_token"


def _token_literal(token: str) -> str:
    if not token or not token.isascii() or not token.isalnum():
        raise ValueError(f"a session token is ASCII letters and digits, got {token!r}")
    return f"'{token}'"


def is_session(token: str) -> str:
    """Whether this statement runs on the session stamped with ``token``."""
    return f"SELECT {_on_session(token)}"


def _on_session(token: str) -> str:
    stamped = f"coalesce(current_setting('{SESSION_STAMP_SETTING}', true), '')"
    return f"{stamped} = {_token_literal(token)}"


def stamp_session(token: str) -> str:
    """Stamp this session and say who answers: ``"<pid> <client addr or -> <port or -1>
    <in recovery: t or f>"`` (:func:`utf8`), the client address and port as the server
    sees them (a proxy shows its own)."""
    answer = (
        "concat_ws(' ', pg_backend_pid(), coalesce(host(inet_client_addr()), '-'),"
        f" coalesce(inet_client_port(), -1), CASE WHEN {IN_RECOVERY} THEN 't' ELSE 'f' END,"
        f" set_config('{SESSION_STAMP_SETTING}', {_token_literal(token)}, false))"
    )
    return f"SELECT {utf8(answer)}"


def still_on_session(token: str, server_pid: int) -> str:
    return f"SELECT {_on_session(token)} AND pg_backend_pid() = {int(server_pid)}"


def session_guarded(server_pid: int, statement: str) -> str:
    """``statement`` (a ``SELECT <expr>``) run only on backend ``server_pid``, the session
    the route was checked on (a pid names one live session); NULL elsewhere."""
    expression = statement.removeprefix("SELECT ")
    return f"SELECT CASE WHEN pg_backend_pid() = {int(server_pid)} THEN {expression} END"


def keeper_beat(key: Key, *, shared: bool) -> str:
    """One heartbeat: which backend answers, whether it holds ``key``, and whether the
    server is in recovery (then the lock coordinates nothing)."""
    return f"SELECT pg_backend_pid(), {_held_here_condition(key, shared=shared)}, {IN_RECOVERY}"


SQLSTATE_DEADLOCK = "40P01"
SQLSTATES_NOT_MIGRATED = frozenset({"42P01", "3F000"})  # undefined table / schema


# -- the ledger and once-per-period records (created by `pgsolo migrate`) ---------------

SCHEMA = "pgsolo"

# Every version is applied once, in order, in one transaction that holds MIGRATION_KEY.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
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
        """,
    ),
    (
        2,
        # Fencing tokens come from a sequence, taken in the statement that takes the
        # lock: nextval() is never rolled back, so a token is never issued twice, even by
        # a transaction that aborts, and it waits for no one (a row per key would make
        # each holder wait for the row lock of the previous holder's open transaction).
        "CREATE SEQUENCE pgsolo.fencing_token_seq",
    ),
    (
        3,
        # Operation keys (pgsolo.once): one row per operation, whose state moves from
        # started to succeeded or failed. 'started' is committed before the side effect
        # runs, so a crash leaves a trace that the next caller takes over; 'attempts'
        # fences a superseded attempt out of recording its success.
        """
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
        """,
    ),
)

MIGRATIONS_TABLE = """
CREATE SCHEMA IF NOT EXISTS pgsolo;
CREATE TABLE IF NOT EXISTS pgsolo.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""

SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM pgsolo.schema_migrations"
# Two statements, not one CASE: a query that names a missing table fails when it is
# parsed, whichever branch would run.
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('pgsolo.schema_migrations') IS NOT NULL"
LEDGER_READY = "SELECT to_regclass('pgsolo.job_runs') IS NOT NULL"


def record_migration(version: int) -> str:
    return f"INSERT INTO pgsolo.schema_migrations (version) VALUES ({int(version)})"


def period_start(period: str) -> str:
    """The start of the current period by the database's clock (never the host's).

    ``period`` is a unit (``minute`` ... ``year``, truncated in UTC) or ``N seconds``
    (``date_bin`` buckets from the Unix epoch).
    """
    if period in PERIOD_UNITS:
        return f"date_trunc('{period}', now(), 'UTC')"
    seconds = parse_period_seconds(period)
    return f"date_bin('{seconds} seconds'::interval, now(), '1970-01-01 00:00:00+00')"


PERIOD_UNITS = ("minute", "hour", "day", "week", "month", "year")
MAX_PERIOD_SECONDS = 100 * 365 * 86_400  # 100 years of 365 days: 3153600000


def parse_period_seconds(period: str) -> int:
    """``"900 seconds"`` -> 900; anything else raises
    :class:`~pgsolo.InvalidArgumentError` (a ``ValueError``). N is from 1 to
    :data:`MAX_PERIOD_SECONDS`, so that the server can always hold the interval."""
    text = period if isinstance(period, str) else ""
    number, _, unit = text.partition(" ")
    if unit != "seconds" or not number.isascii() or not number.isdigit():
        raise InvalidArgumentError(
            f"a period is one of {', '.join(PERIOD_UNITS)} or 'N seconds' (N from 1 to"
            f" {MAX_PERIOD_SECONDS}, 100 years), got {period!r}"
        )
    digits = number.lstrip("0") or "0"
    # More digits than any allowed N: too large, without parsing a huge number.
    value = int(digits) if len(digits) <= len(str(MAX_PERIOD_SECONDS)) else MAX_PERIOD_SECONDS + 1
    check_seconds("a period of 'N seconds'", value, 1, MAX_PERIOD_SECONDS)
    return value


def period_done(job: str, period: str) -> str:
    return (
        "SELECT EXISTS (SELECT 1 FROM pgsolo.job_periods"
        f" WHERE job = {sql_text(job)} AND period = {sql_text(period)}"
        f" AND period_start = {period_start(period)})"
    )


def period_record(job: str, period: str, *, host: str, pid: int) -> str:
    """Mark this period done; returns true, or nothing if it was already marked."""
    return (
        "INSERT INTO pgsolo.job_periods (job, period, period_start, host, pid)"
        f" VALUES ({sql_text(job)}, {sql_text(period)}, {period_start(period)},"
        f" {sql_text(host)}, {int(pid)})"
        " ON CONFLICT DO NOTHING RETURNING true"
    )


def record_attempt(
    *,
    job: str,
    lock_key: str,
    outcome: str,
    reason: str | None,
    duration_s: float,
    lock_wait_s: float,
    host: str,
    pid: int,
    backend_pid: int | None,
    application_name: str | None,
    exit_code: int | None,
    error: str | None,
) -> str:
    """One ledger row. Times are the database's: finished now, started that many
    seconds earlier by the host's monotonic clock (which never jumps)."""
    elapsed = float(lock_wait_s) + float(duration_s)
    return (
        "INSERT INTO pgsolo.job_runs (job, lock_key, outcome, reason, started_at,"
        " finished_at, duration_ms, lock_wait_ms, host, pid, backend_pid,"
        " application_name, exit_code, error) VALUES ("
        f"{sql_text(job)}, {sql_text(lock_key)}, {sql_text(outcome)},"
        f" {_text_or_null(reason)}, clock_timestamp() - make_interval(secs => {elapsed!r}),"
        f" clock_timestamp(), {float(duration_s) * 1000!r}, {float(lock_wait_s) * 1000!r},"
        f" {sql_text(host)}, {int(pid)}, {_int_or_null(backend_pid)},"
        f" {_text_or_null(application_name)}, {_int_or_null(exit_code)},"
        f" {_text_or_null(error)})"
    )


def history(*, job: str | None, limit: int) -> str:
    """The latest attempts, newest first, as one JSON array (:func:`utf8`)."""
    where = f"WHERE job = {sql_text(job)}" if job is not None else ""
    rows = "coalesce(json_agg(r ORDER BY r.started_at DESC, r.id DESC), '[]'::json)"
    return (
        f"SELECT {utf8(rows)}"
        " FROM (SELECT id, job, lock_key, outcome, reason, started_at, finished_at,"
        " duration_ms, lock_wait_ms, host, pid, backend_pid, application_name,"
        f" exit_code, error FROM pgsolo.job_runs {where}"
        f" ORDER BY started_at DESC, id DESC LIMIT {int(limit)}) r"
    )


def _text_or_null(value: str | None) -> str:
    return "NULL" if value is None else sql_text(value.replace("\0", ""))


def _int_or_null(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))


# -- operation keys (pgsolo.once; the table is migration 3) ------------------------------

SQLSTATE_ATTEMPT_SUPERSEDED = "PGSLS"  # raised by once_succeed; pgsolo's own code


def _operation(op_key: str) -> str:
    return f"op_key = {sql_text(op_key)}"


def once_read(op_key: str) -> str:
    """The operation's row as one JSON object (its result nested; :func:`utf8`), or no
    row."""
    row = (
        "json_build_object('state', state, 'attempts', attempts,"
        " 'idempotency_key', idempotency_key, 'result', result)"
    )
    return f"SELECT {utf8(row)} FROM pgsolo.operations WHERE {_operation(op_key)}"


def once_start(op_key: str, idempotency_key: str, *, host: str, pid: int) -> str:
    """Begin an attempt: insert the row, or take over one that is not succeeded.

    Returns the attempt's number and the stored idempotency key as JSON (:func:`utf8`),
    or no row
    when the operation has succeeded meanwhile. The stored key wins over the one given,
    so a retry always presents the key of the first attempt.
    """
    return (
        "INSERT INTO pgsolo.operations AS o (op_key, state, idempotency_key, attempts,"
        " holder_pid, host, pid)"
        f" VALUES ({sql_text(op_key)}, 'started', {sql_text(idempotency_key)}, 1,"
        f" pg_backend_pid(), {sql_text(host)}, {int(pid)})"
        " ON CONFLICT (op_key) DO UPDATE SET state = 'started', attempts = o.attempts + 1,"
        " holder_pid = excluded.holder_pid, host = excluded.host, pid = excluded.pid,"
        " result = NULL, error = NULL, finished_at = NULL, updated_at = now()"
        " WHERE o.state <> 'succeeded'"
        " RETURNING "
        + utf8("json_build_object('attempts', o.attempts, 'idempotency_key', o.idempotency_key)")
    )


def _this_attempt(op_key: str, attempt: int) -> str:
    return f"{_operation(op_key)} AND state = 'started' AND attempts = {int(attempt)}"


def once_succeed(op_key: str, attempt: int, result_json: str) -> str:
    """Record success, or fail the transaction (and the work in it) if another caller
    has taken the operation over since this attempt began."""
    return (
        "DO $pgsolo$BEGIN UPDATE pgsolo.operations SET state = 'succeeded',"
        f" result = ({sql_text(result_json)})::jsonb, finished_at = now(), updated_at = now()"
        f" WHERE {_this_attempt(op_key, attempt)};"
        f" IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_ATTEMPT_SUPERSEDED}',"
        " MESSAGE = 'pgsolo: this attempt at the operation was taken over by another caller';"
        " END IF; END$pgsolo$"
    )


def once_result(op_key: str) -> str:
    """The stored result, as the server keeps it (what a later call will read; JSON,
    :func:`utf8`)."""
    return f"SELECT {utf8('result')} FROM pgsolo.operations WHERE {_operation(op_key)}"


def once_fail(op_key: str, attempt: int, error: str) -> str:
    """Record a failed attempt (nothing, if another caller has taken it over)."""
    return (
        "UPDATE pgsolo.operations SET state = 'failed',"
        f" error = {_text_or_null(error)}, finished_at = now(), updated_at = now()"
        f" WHERE {_this_attempt(op_key, attempt)}"
    )


# -- the monitor: `pgsolo locks`, `pgsolo doctor`, `pgsolo terminate` --------------------

# pg_stat_activity is read once per transaction and cached; clearing the cache first
# makes it newer than the pg_locks snapshot of the next statement, even inside a
# transaction the caller has open (the monitor's session-lifetime rule depends on it).
CLEAR_ACTIVITY_SNAPSHOT = "SELECT pg_stat_clear_snapshot()"

MONITOR_QUERY_CHARS = 200  # the current query is cut to this many characters on the server

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
        " 'locks', coalesce((SELECT json_agg(json_build_array(pid, classid, objid, objsubid,"
        " shared, granted, waitstart,"
        " CASE WHEN granted THEN NULL ELSE pg_blocking_pids(pid) END)) FROM l), '[]'::json),"
        " 'sessions', coalesce((SELECT json_object_agg(a.pid, json_build_object("
        "'application_name', a.application_name, 'client_addr', host(a.client_addr),"
        " 'client_port', a.client_port, 'state', a.state, 'backend_start', a.backend_start,"
        " 'xact_start', a.xact_start, 'query_start', a.query_start,"
        " 'state_change', a.state_change,"
        f" 'query', left(a.query, {int(MONITOR_QUERY_CHARS)})))"
        " FROM (SELECT DISTINCT pid FROM l WHERE pid IS NOT NULL) p,"
        " LATERAL pg_stat_get_activity(p.pid) a), '{}'::json))"
    )
    return f"{locks} SELECT {utf8(snapshot)}"


# The functions that take an advisory lock (not the unlocks): who may call them can
# hold any key and starve a job.
ADVISORY_LOCK_FUNCTIONS_PATTERN = "^pg_(try_)?advisory_(xact_)?lock(_shared)?$"

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
    # A wait whose own statement sets lock_timeout (pgsolo's do) is bounded.
    " 'bounded_wait', a.query ILIKE '%lock_timeout%')"
    " ORDER BY p.pid)"
    " FROM (SELECT pid, count(*) FILTER (WHERE granted) AS held,"
    " count(*) FILTER (WHERE NOT granted) AS waiting,"
    " min(waitstart) FILTER (WHERE NOT granted) AS waiting_since"
    " FROM l WHERE here AND pid IS NOT NULL GROUP BY pid) p,"
    " LATERAL pg_stat_get_activity(p.pid) a), '[]'::json))"
)
# One JSON object (utf8(): role and database names can hold any character).
DOCTOR = f"{_DOCTOR_LOCKS} SELECT {utf8(_DOCTOR_SNAPSHOT)}"


def terminate_backend(pid: int, *, wait_ms: int) -> str:
    """End backend ``pid`` and wait up to ``wait_ms`` for it to be gone (true if it is)."""
    return f"SELECT pg_terminate_backend({int(pid)}, {int(wait_ms)})"
