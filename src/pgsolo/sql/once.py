"""The statements of operation keys (:mod:`pgsolo.once`; the table is migration 3)."""

from __future__ import annotations

from .states import SQLSTATE_ATTEMPT_SUPERSEDED
from .text import sql_text, text_or_null, utf8

__all__ = [
    "once_fail",
    "once_read",
    "once_result",
    "once_start",
    "once_succeed",
]


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
        f" error = {text_or_null(error)}, finished_at = now(), updated_at = now()"
        f" WHERE {_this_attempt(op_key, attempt)}"
    )
