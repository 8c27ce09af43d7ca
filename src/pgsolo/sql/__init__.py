"""Every SQL statement pgsolo sends, in one place.

Statements are plain ASCII text with no bind parameters so that several of them can
travel in one simple-query message (one round trip). That is safe because the only values
spliced in are Python ints validated by :class:`~pgsolo.keys.Key`, millisecond counts that
are ints by construction, period units from a fixed list, and text (job names, hosts,
error messages) written as hex digits by :func:`~pgsolo.sql.text.sql_text`, which no
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

from .ledger import (
    history,
    name_fits,
    period_done,
    period_record,
    period_start,
    record_attempt,
)
from .locks import (
    BEGIN,
    CHANGES_NOTHING,
    COMMIT,
    FENCING_SEQUENCE,
    IN_RECOVERY,
    LAST_FENCING_TOKEN,
    REFUSE_STANDBY,
    RESTORE_LOCK_TIMEOUT,
    ROLLBACK,
    SAVE_LOCK_TIMEOUT,
    SAVEPOINT,
    SAVEPOINT_RELEASE,
    SAVEPOINT_UNDO,
    SESSION_STAMP_SETTING,
    STATEMENT_TIMEOUT_MS,
    UNLOCK_ALL,
    XACT_MARKER_SETTING,
    acquire,
    assert_same_transaction,
    held_here,
    is_session,
    keeper_beat,
    lock_function,
    mark_transaction,
    name_to_sql,
    session_guarded,
    set_local_lock_timeout,
    stamp_session,
    still_on_session,
    unlock,
)
from .monitor import (
    ADVISORY_LOCK_FUNCTIONS_PATTERN,
    CLEAR_ACTIVITY_SNAPSHOT,
    DOCTOR,
    LEDGER_KEYS,
    MONITOR_QUERY_CHARS,
    advisory_locks,
    terminate_backend,
)
from .once import (
    once_fail,
    once_read,
    once_result,
    once_start,
    once_succeed,
)
from .schema import (
    MIGRATIONS_TABLE,
    SCHEMA,
    SCHEMA_VERSION,
    grants,
    privilege_error,
    quote_name,
    record_migration,
    require_privileges,
)
from .states import (
    SQLSTATE_ATTEMPT_SUPERSEDED,
    SQLSTATE_DEADLOCK,
    SQLSTATE_IN_RECOVERY,
    SQLSTATE_INVALID_SCHEMA_NAME,
    SQLSTATE_LOCK_GONE,
    SQLSTATE_LOCK_NOT_AVAILABLE,
    SQLSTATE_UNDEFINED_TABLE,
    Meaning,
    meaning,
)
from .text import (
    read_json,
    read_text,
    returns_rows,
    sql_literal,
    sql_text,
    text_or_null,
    utf8,
)

__all__ = [
    "ADVISORY_LOCK_FUNCTIONS_PATTERN",
    "BEGIN",
    "CHANGES_NOTHING",
    "CLEAR_ACTIVITY_SNAPSHOT",
    "COMMIT",
    "DOCTOR",
    "FENCING_SEQUENCE",
    "IN_RECOVERY",
    "LAST_FENCING_TOKEN",
    "LEDGER_KEYS",
    "MIGRATIONS_TABLE",
    "MONITOR_QUERY_CHARS",
    "REFUSE_STANDBY",
    "RESTORE_LOCK_TIMEOUT",
    "ROLLBACK",
    "SAVEPOINT",
    "SAVEPOINT_RELEASE",
    "SAVEPOINT_UNDO",
    "SAVE_LOCK_TIMEOUT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SESSION_STAMP_SETTING",
    "SQLSTATE_ATTEMPT_SUPERSEDED",
    "SQLSTATE_DEADLOCK",
    "SQLSTATE_INVALID_SCHEMA_NAME",
    "SQLSTATE_IN_RECOVERY",
    "SQLSTATE_LOCK_GONE",
    "SQLSTATE_LOCK_NOT_AVAILABLE",
    "SQLSTATE_UNDEFINED_TABLE",
    "STATEMENT_TIMEOUT_MS",
    "UNLOCK_ALL",
    "XACT_MARKER_SETTING",
    "Meaning",
    "acquire",
    "advisory_locks",
    "assert_same_transaction",
    "grants",
    "held_here",
    "history",
    "is_session",
    "keeper_beat",
    "lock_function",
    "mark_transaction",
    "meaning",
    "name_fits",
    "name_to_sql",
    "once_fail",
    "once_read",
    "once_result",
    "once_start",
    "once_succeed",
    "period_done",
    "period_record",
    "period_start",
    "privilege_error",
    "quote_name",
    "read_json",
    "read_text",
    "record_attempt",
    "record_migration",
    "require_privileges",
    "returns_rows",
    "session_guarded",
    "set_local_lock_timeout",
    "sql_literal",
    "sql_text",
    "stamp_session",
    "still_on_session",
    "terminate_backend",
    "text_or_null",
    "unlock",
    "utf8",
]
