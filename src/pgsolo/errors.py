"""The exception tree: every error pgsolo raises derives from :class:`PgsoloError`.

Errors raised before any SQL is sent (bad keys, bad options, a connection in the wrong
state) derive from :class:`UsageError` as well as the standard exception a caller would
expect (``ValueError``, ``TypeError``), so code that already catches those keeps working.
"""

from __future__ import annotations

from .reasons import LostReason, UnsafeReason

__all__ = [
    "ConnectionStateError",
    "DatabaseUnavailableError",
    "InsufficientPrivilegeError",
    "InvalidArgumentError",
    "InvalidDsnError",
    "InvalidKeyError",
    "InvalidOperationError",
    "InvalidOperationKeyError",
    "KeyCollisionError",
    "LockDeadlockError",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUnavailableError",
    "NotMigratedError",
    "PeriodUnconfirmedError",
    "PgsoloError",
    "ResultNotStorableError",
    "TransactionFailedError",
    "UnsafeConnectionError",
    "UnsupportedConnectionError",
    "UsageError",
]


class PgsoloError(Exception):
    """Base class of every error raised by pgsolo.

    Every one travels between processes as itself. Pickled (a process pool's worker,
    APScheduler's ``ProcessPoolExecutor``, Celery's pickle serializer), it keeps its
    attributes (``key``, ``reason``...), which Python's default would need to pass to
    ``__init__`` again. Rebuilt from its message alone, as a JSON result backend
    (Celery's default) rebuilds an error, it is of the same class, and its attributes
    are None (or empty): pgsolo always sets them, and its message says them too."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(kind: type[PgsoloError], args: tuple[object, ...]) -> PgsoloError:
    """An unpickled error: its message as raised, its attributes set from the pickle's
    state (``__init__`` is not run again: it would need its keyword arguments)."""
    error = kind.__new__(kind, *args)
    error.args = args  # an OSError's (TimeoutError's) __new__ leaves them to __init__
    return error


class UsageError(PgsoloError):
    """The call itself is wrong; detected before anything is sent to the server."""


class InvalidKeyError(UsageError, ValueError):
    """A lock key is not an int64, a pair of int32, or a valid name (key spec v1)."""


class KeyCollisionError(UsageError, ValueError):
    """A registry was asked to map two names to one key, or one name to two keys."""


class InvalidOperationKeyError(UsageError, ValueError):
    """An operation key is not non-empty text without NUL of at most 512 UTF-8 bytes."""


class InvalidOperationError(UsageError, TypeError):
    """What was given to run as an operation is not a callable of the right kind."""


class ResultNotStorableError(UsageError, ValueError):
    """An operation returned a value pgsolo cannot store: not JSON, or over 1 MiB.

    Unlike other usage errors it can only be detected once the operation has returned;
    it is raised before its database work commits and before success is recorded.
    """


class NotMigratedError(UsageError):
    """pgsolo's tables are missing in this database (or older than this pgsolo needs):
    ``pgsolo migrate`` has not run. Nothing was held or run.

    ``version``: the schema version pgsolo found, when it asked before anything else;
    None when a table turned out to be missing as it was used."""

    def __init__(self, message: str, *, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


class InsufficientPrivilegeError(PgsoloError):
    """The database role lacks a privilege pgsolo needs (SQLSTATE 42501, permission
    denied); nothing was held or run, unless the message says otherwise.

    ``needs``: what would grant it, as SQL statements (``GRANT ...``) or the name of a
    predefined role, for an administrator to run; the message repeats them, and the
    driver's error is the cause. docs/security.md lists every feature's privileges."""

    def __init__(self, message: str, *, needs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.needs = needs


class UnsupportedConnectionError(UsageError, TypeError):
    """What was passed as a connection is not one pgsolo can use (the message names
    those it can), or is sync where the call is async, or the other way round."""


class ConnectionStateError(UsageError):
    """The connection cannot take this lock in its current state.

    The usual case: a transaction-level lock on an autocommit connection with no
    transaction open, which PostgreSQL would release as soon as the statement ended.
    """


class UnsafeConnectionError(PgsoloError):
    """The connection cannot coordinate anything safely; nothing was taken.

    ``reason`` says why: ``server-in-recovery`` (a hot standby, which grants advisory
    locks locally, unseen by the primary: any lock kind), ``transaction-pooling`` (a
    transaction-pooling proxy would strand a session lock) or ``connection-moved`` (the
    connection no longer reaches the backend a session lock was taken on); None only in
    an error rebuilt from its message alone (see :class:`PgsoloError`)."""

    def __init__(self, message: str, *, reason: UnsafeReason | None = None) -> None:
        super().__init__(message)
        self.reason: UnsafeReason | None = reason


class DatabaseUnavailableError(PgsoloError):
    """A connection pgsolo opens itself (from a connection string) could not be opened
    within its connect timeout, or gave no answer to one of pgsolo's statements within
    its deadline (``unresponsive``: pgsolo then shut it down); or a connection, the
    caller's or pgsolo's, failed under one of pgsolo's statements while a lock was being
    taken (nothing is held then). The driver's error is the cause; on a framework's
    connection, the framework's (Django's ``OperationalError``, whose cause is the
    driver's), whose books say the connection failed, as if its own call had."""

    def __init__(self, message: str, *, unresponsive: bool = False) -> None:
        super().__init__(message)
        self.unresponsive = unresponsive


class InvalidDsnError(UsageError, ValueError):
    """A connection string cannot be parsed. The message never quotes it: the part that
    could not be read may be a password."""


class LockUnavailableError(PgsoloError):
    """A lock could not be acquired. Carries the key it was about."""

    def __init__(self, message: str, *, key: object = None) -> None:
        super().__init__(message)
        self.key = key


class LockDeadlockError(LockUnavailableError):
    """PostgreSQL broke a deadlock by failing this wait (SQLSTATE 40P01): sessions were
    waiting for each other's advisory locks, typically two keys taken in opposite orders.
    ``keys`` lists the advisory keys in the cycle, as the server reported them."""

    def __init__(self, message: str, *, key: object = None, keys: tuple[object, ...] = ()) -> None:
        super().__init__(message, key=key)
        self.keys = keys


class LockTimeoutError(LockUnavailableError, TimeoutError):
    """A bounded wait for a lock ran out (PostgreSQL's ``lock_timeout``, SQLSTATE 55P03)."""

    def __init__(self, message: str, *, key: object = None, timeout: float | None = None) -> None:
        super().__init__(message, key=key)
        self.timeout = timeout


class LockNotHeldError(PgsoloError):
    """A release was asked for a lock this connection does not hold.

    PostgreSQL only warns in that case; pgsolo reports it, because it means the
    caller's idea of who holds what is wrong.
    """

    def __init__(self, message: str, *, key: object = None) -> None:
        super().__init__(message)
        self.key = key


class LockLostError(PgsoloError):
    """A lock pgsolo believed held is gone: its session ended (connection closed,
    backend terminated) or something released it behind pgsolo's back.

    ``reason`` is always one code of :data:`pgsolo.reasons.LostReason`:
    ``connection-lost``, ``connection-unresponsive``, ``connection-moved`` (a
    transaction-pooling proxy), ``server-in-recovery``, ``lock-released``,
    ``keeper-failed`` or ``work-ended-transaction`` (None only in an error rebuilt from
    its message alone, see :class:`PgsoloError`); the message says the rest."""

    def __init__(
        self, message: str, *, key: object = None, reason: LostReason | None = None
    ) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class PeriodUnconfirmedError(LockLostError):
    """A session-lock job's work ran, and its connection failed as pgsolo recorded the
    period (the lock went with it): the server may have recorded it all the same (a frozen
    backend that resumed), so the next run in the period skips if it did and runs again if
    not. A :class:`LockLostError`, which says what the attempt came to; this class says
    where it ended."""


class TransactionFailedError(PgsoloError):
    """The transaction pgsolo opened for a transaction-level lock was aborted by an
    error that the protected block caught and did not re-raise; it was rolled back and
    nothing in it was committed."""


class InvalidArgumentError(UsageError, ValueError):
    """An argument other than a key is out of its range or of the wrong kind."""
