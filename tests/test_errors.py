"""pgsolo's errors (``pgsolo.errors``) travel between processes whole: a process pool's
worker sends the error its job raised to its parent by pickling it (APScheduler's
``ProcessPoolExecutor``, Celery's result backend), and an error whose ``__init__`` takes
keyword-only arguments could not be rebuilt there by Python's default."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import pgsolo
from pgsolo import errors

KEY = pgsolo.as_key("errors-travel")

EVERY_ERROR = [
    errors.PgsoloError("base"),
    errors.UsageError("usage"),
    errors.InvalidKeyError("bad key"),
    errors.KeyCollisionError("collision"),
    errors.InvalidOperationKeyError("bad operation key"),
    errors.InvalidOperationError("not callable"),
    errors.ResultNotStorableError("too big"),
    errors.UnsupportedConnectionError("not a connection"),
    errors.ConnectionStateError("in a transaction"),
    errors.InvalidDsnError("unreadable"),
    errors.InvalidArgumentError("out of range"),
    errors.NotMigratedError("not migrated", version=3),
    errors.InsufficientPrivilegeError("denied", needs=("GRANT USAGE ON SCHEMA pgsolo",)),
    errors.UnsafeConnectionError("pooled", reason="transaction-pooling"),
    errors.DatabaseUnavailableError("down", unresponsive=True),
    errors.LockUnavailableError("busy", key=KEY),
    errors.LockDeadlockError("deadlock", key=KEY, keys=(KEY,)),
    errors.LockTimeoutError("timed out", key=KEY, timeout=1.5),
    errors.LockNotHeldError("not held", key=KEY),
    errors.LockLostError("lost", key=KEY, reason="connection-lost"),
    errors.PeriodUnconfirmedError("unconfirmed", key=KEY, reason="connection-lost"),
    errors.TransactionFailedError("failed"),
]


def test_every_error_class_is_in_the_list() -> None:
    assert {type(error).__name__ for error in EVERY_ERROR} == set(errors.__all__)


@pytest.mark.parametrize("error", EVERY_ERROR, ids=lambda error: type(error).__name__)
def test_an_error_pickles_whole(error: errors.PgsoloError) -> None:
    """Guards LockLostError, LockTimeoutError and the others with keyword-only arguments,
    which could not be unpickled (TypeError: missing keyword-only arguments): a process
    pool broke, and Celery reported a plain PgsoloError."""
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert again.args == error.args
    assert vars(again) == vars(error)


@pytest.mark.parametrize("error", EVERY_ERROR, ids=lambda error: type(error).__name__)
def test_an_error_rebuilt_from_its_message_alone_keeps_its_class(
    error: errors.PgsoloError,
) -> None:
    """What a JSON result backend (Celery's default) does: ``type(error)(*error.args)``.
    An error that could not be rebuilt so came back as a plain Exception."""
    again = type(error)(*error.args)
    assert type(again) is type(error)
    assert str(again) == str(error)


def _raises_lock_lost() -> None:
    raise errors.LockLostError("the lock was lost", key=KEY, reason="connection-lost")


def test_an_error_a_worker_process_raises_reaches_its_parent() -> None:
    with ProcessPoolExecutor(max_workers=1) as pool:
        failure = pool.submit(_raises_lock_lost).exception(timeout=60)
    assert isinstance(failure, errors.LockLostError)
    assert failure.key == KEY
    assert failure.reason == "connection-lost"
    assert str(failure) == "the lock was lost"
