"""Reason codes: the one vocabulary of why an attempt was skipped, lost or failed.

A reason is a short, stable code, never a message: it is what ``JobResult.reason``,
``LockLostError.reason``, the ledger's ``reason`` column, the ``reason`` label of
``pgsolo_job_attempts_total`` and ``pgsolo run --json`` carry. What happened in words is
in the error (``JobResult.error``, the exception's text). Pure: no I/O.

Lost (the lock went while it was meant to be held; ``LockLostError.reason``):

- ``connection-lost``: the lock's session ended (connection closed or broken, backend
  terminated, server restarted), so PostgreSQL released the lock.
- ``connection-unresponsive``: the server did not answer within the deadline (the
  keeper's ``timeout``, ``--check-timeout``), so pgsolo shut the connection down.
- ``connection-moved``: the connection now reaches another backend than the one holding
  the lock (a transaction-pooling proxy).
- ``server-in-recovery``: the server answering the lock's connection is in recovery (a
  standby), where an advisory lock coordinates nothing.
- ``lock-released``: the session lives but the lock is gone: something released it
  behind pgsolo's back (``pg_advisory_unlock_all``, ``DISCARD ALL``, a second unlock), or
  another caller took an operation over meanwhile.
- ``keeper-failed``: the keeper itself failed, so nothing vouches for the lock.
- ``work-ended-transaction``: the work of a transaction-level job committed or rolled
  back the locked transaction itself, and went on without the lock (if it began another
  transaction, that one was rolled back at the job's end). One code on every kind of
  connection, whether the library saw the transaction end or the commit check found the
  lock gone.

Skipped: ``busy`` (another holder, or the wait ran out) and
``already-done-this-period``.

Unsafe (``UnsafeConnectionError.reason``: nothing was taken): ``server-in-recovery`` (a
hot standby, for any lock), ``transaction-pooling`` (a session lock behind a
transaction-pooling proxy), ``proxy-unchecked`` (a proxy that can only be checked between
transactions, met inside one), ``connection-moved``.

Failed (a failure of the work itself has no reason, its exception is the error):
``period-not-recorded`` (a session job or ``pgsolo run``: the work is done, but its
period could not be marked, so the next run in this period would do it again); and for
``pgsolo run`` only, an unsafe reason, ``interrupted``, ``command-not-found``,
``cannot-execute``, ``killed-by-signal``.

``pgsolo run --json`` with no attempt made (``outcome`` null): ``usage-error``,
``not-migrated``, ``database-unavailable``, ``database-error``.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, get_args

__all__ = [
    "FAIL_REASONS",
    "LOST_REASONS",
    "REASONS",
    "RUN_REASONS",
    "SKIP_REASONS",
    "FailReason",
    "LostReason",
    "Reason",
    "RunReason",
    "SkipReason",
    "UnsafeReason",
]

LostReason: TypeAlias = Literal[
    "connection-lost",
    "connection-unresponsive",
    "connection-moved",
    "server-in-recovery",
    "lock-released",
    "keeper-failed",
    "work-ended-transaction",
]
SkipReason: TypeAlias = Literal["busy", "already-done-this-period"]
UnsafeReason: TypeAlias = Literal[
    "server-in-recovery", "transaction-pooling", "proxy-unchecked", "connection-moved"
]
"""What ``UnsafeConnectionError.reason`` holds."""
FailReason: TypeAlias = Literal[
    UnsafeReason,
    "interrupted",
    "command-not-found",
    "cannot-execute",
    "killed-by-signal",
    "period-not-recorded",
]
Reason: TypeAlias = LostReason | SkipReason | FailReason
"""What ``JobResult.reason`` holds (or None: completed, or failed by the work's own error)."""
RunReason: TypeAlias = Literal[
    "usage-error",
    "not-migrated",
    "insufficient-privilege",
    "database-unavailable",
    "database-error",
]
"""``pgsolo run --json``'s reason when no attempt was made."""

LOST_REASONS: frozenset[str] = frozenset(get_args(LostReason))
SKIP_REASONS: frozenset[str] = frozenset(get_args(SkipReason))
FAIL_REASONS: frozenset[str] = frozenset(get_args(FailReason))
REASONS: frozenset[str] = LOST_REASONS | SKIP_REASONS | FAIL_REASONS
RUN_REASONS: frozenset[str] = frozenset(get_args(RunReason))
