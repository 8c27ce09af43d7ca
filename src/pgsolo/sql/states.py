"""Every SQLSTATE pgsolo reads, and what it means to pgsolo: the one table.

Drivers say which SQLSTATE an error carries (``driver.sqlstate(exc)``); :func:`meaning`
says what that is to pgsolo. Codes starting ``PGS`` are pgsolo's own, raised by its
statements (see :mod:`pgsolo.sql.locks` and :mod:`pgsolo.sql.once`).
"""

from __future__ import annotations

import enum

__all__ = [
    "SQLSTATE_ATTEMPT_SUPERSEDED",
    "SQLSTATE_DEADLOCK",
    "SQLSTATE_DUPLICATE_PREPARED",
    "SQLSTATE_INSUFFICIENT_PRIVILEGE",
    "SQLSTATE_INVALID_SCHEMA_NAME",
    "SQLSTATE_LOCK_GONE",
    "SQLSTATE_LOCK_NOT_AVAILABLE",
    "SQLSTATE_NO_PREPARED",
    "SQLSTATE_QUERY_CANCELED",
    "SQLSTATE_UNDEFINED_TABLE",
    "UNLOCK_ANSWERS",
    "Meaning",
    "meaning",
]

SQLSTATE_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out
SQLSTATE_QUERY_CANCELED = "57014"  # statement_timeout ran out, or pg_cancel_backend
SQLSTATE_DEADLOCK = "40P01"
SQLSTATE_UNDEFINED_TABLE = "42P01"
SQLSTATE_INVALID_SCHEMA_NAME = "3F000"
SQLSTATE_INSUFFICIENT_PRIVILEGE = "42501"  # permission denied: a GRANT is missing
SQLSTATE_UNDEFINED_OBJECT = "42704"  # in pgsolo migrate --grant-to: no such role
SQLSTATE_UNTRANSLATABLE = "22P05"  # text the database's encoding cannot hold
SQLSTATE_LOCK_GONE = "PGSLG"  # raised by sql.locks.assert_same_transaction
SQLSTATE_ATTEMPT_SUPERSEDED = "PGSLS"  # raised by sql.once.once_succeed
SQLSTATE_SAVEPOINT_GONE = "3B001"  # no savepoint of that name in this transaction
SQLSTATE_TRANSACTION_FAILED = "25P02"  # a statement sent into a failed transaction
# A prepared statement of pgsolo's (sql.locks.Prepared) that the session does not have (the
# caller's DEALLOCATE ALL or DISCARD ALL), or has already (a pooled session used before).
SQLSTATE_NO_PREPARED = "26000"
SQLSTATE_DUPLICATE_PREPARED = "42P05"
# Raised by sql.locks.unlock_keeping_failure: the unlock's answer (released, not held,
# not this session), carried out of a transaction that is failed again on purpose.
UNLOCK_ANSWERS: dict[str, bool | None] = {"PGSU1": True, "PGSU0": False, "PGSUN": None}


class Meaning(enum.Enum):
    LOCK_TIMEOUT = "a bounded wait for a lock ran out"
    CANCELED = "the server cancelled the statement (statement_timeout, pg_cancel_backend)"
    DEADLOCK = "PostgreSQL broke a deadlock by failing this wait"
    NOT_MIGRATED = "pgsolo's tables are missing: pgsolo migrate has not run"
    LOCK_GONE = "a transaction-level lock was no longer held at commit"
    SUPERSEDED = "another caller took an operation over"
    UNTRANSLATABLE = "the database's encoding cannot hold a character of the text"
    NO_PRIVILEGE = "the role lacks a privilege (a GRANT is missing)"
    UNDEFINED_OBJECT = "an object named in the statement does not exist"
    SAVEPOINT_GONE = "the savepoint named was released or rolled back past"
    TRANSACTION_FAILED = "the transaction had failed: only a rollback runs in it"
    UNLOCK_ANSWER = "a session lock was unlocked in a failed transaction, left failed"


_MEANINGS: dict[str, Meaning] = {
    SQLSTATE_LOCK_NOT_AVAILABLE: Meaning.LOCK_TIMEOUT,
    SQLSTATE_QUERY_CANCELED: Meaning.CANCELED,
    SQLSTATE_DEADLOCK: Meaning.DEADLOCK,
    SQLSTATE_UNDEFINED_TABLE: Meaning.NOT_MIGRATED,
    SQLSTATE_INVALID_SCHEMA_NAME: Meaning.NOT_MIGRATED,
    SQLSTATE_LOCK_GONE: Meaning.LOCK_GONE,
    SQLSTATE_ATTEMPT_SUPERSEDED: Meaning.SUPERSEDED,
    SQLSTATE_UNTRANSLATABLE: Meaning.UNTRANSLATABLE,
    SQLSTATE_INSUFFICIENT_PRIVILEGE: Meaning.NO_PRIVILEGE,
    SQLSTATE_UNDEFINED_OBJECT: Meaning.UNDEFINED_OBJECT,
    SQLSTATE_SAVEPOINT_GONE: Meaning.SAVEPOINT_GONE,
    SQLSTATE_TRANSACTION_FAILED: Meaning.TRANSACTION_FAILED,
    **dict.fromkeys(UNLOCK_ANSWERS, Meaning.UNLOCK_ANSWER),
}


def meaning(sqlstate: str | None) -> Meaning | None:
    """What ``sqlstate`` means to pgsolo, or None (an error pgsolo has no word for)."""
    return _MEANINGS.get(sqlstate) if sqlstate is not None else None
