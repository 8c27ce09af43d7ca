"""Someone else's hand on a key: another session that holds it, and an operator who ends
the session holding it. Through pgsolo's public API, on connections of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pgsolo

from ..drivers.connect import connect_psycopg

if TYPE_CHECKING:
    import psycopg

__all__ = ["hold_elsewhere", "lose", "losing"]

POLL_SECONDS = 0.01  # how often lose() looks for a holder


@contextmanager
def hold_elsewhere(
    dsn: str,
    key: pgsolo.KeyLike,
    *,
    shared: bool = False,
    namespace: int | None = None,
    registry: pgsolo.Registry | None = None,
) -> Iterator[int]:
    """Inside the block another session holds ``key`` (a session advisory lock, exclusive
    unless ``shared``), so that code under test finds it busy: a job is skipped ``busy``,
    a lock without ``wait`` raises :class:`~pgsolo.LockUnavailableError`. Yields that
    session's backend pid. ``key``, ``namespace`` and ``registry`` mean what they mean to
    :func:`pgsolo.session_lock`; a key another session holds already raises
    :class:`~pgsolo.LockUnavailableError` at once."""
    with (
        connect_psycopg(
            dsn, autocommit=True, application_name="pgsolo.testing:hold_elsewhere"
        ) as conn,
        pgsolo.session_lock(
            conn, key, shared=shared, namespace=namespace, registry=registry
        ) as lock,
    ):
        if not lock.acquired:  # a test that sets up two holders means something else
            raise pgsolo.LockUnavailableError(
                f"hold_elsewhere: the key {key!r} is held already", key=key
            )
        yield conn.info.backend_pid


def lose(
    dsn: str,
    key: pgsolo.KeyLike,
    *,
    timeout: float = 10.0,
    namespace: int | None = None,
    registry: pgsolo.Registry | None = None,
) -> list[int]:
    """Wait up to ``timeout`` seconds for a session to hold ``key``, then terminate every
    session holding it (``pg_terminate_backend``, what an operator or a failover does) and
    return their pids: the lock is lost under whoever held it, so their ``on_lost``
    (:class:`~pgsolo.Keep`) runs and a job ends ``lost``. Raises :class:`TimeoutError`
    when no session held the key in time."""
    with connect_psycopg(dsn, autocommit=True, application_name="pgsolo.testing:lose") as conn:
        deadline = time.monotonic() + timeout
        while not (pids := _holding_sessions(conn, key, namespace, registry)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no session held the key {key!r} within {timeout:g} s")
            time.sleep(POLL_SECONDS)
        for pid in pids:
            pgsolo.terminate_backend(conn, pid)
        return pids


def _holding_sessions(
    conn: psycopg.Connection[Any],
    key: pgsolo.KeyLike,
    namespace: int | None,
    registry: pgsolo.Registry | None,
) -> list[int]:
    """The pids of the sessions holding ``key`` (a prepared transaction holds with none,
    and no terminating ends it)."""
    holders = pgsolo.lock_holders(conn, key, namespace=namespace, registry=registry)
    return [holder.pid for holder in holders if holder.pid is not None]


@contextmanager
def losing(
    dsn: str,
    key: pgsolo.KeyLike,
    *,
    timeout: float = 10.0,
    namespace: int | None = None,
    registry: pgsolo.Registry | None = None,
) -> Iterator[list[int]]:
    """:func:`lose` from a thread while the block runs: code in the block that takes
    ``key`` (your job, unchanged) loses it while it holds it. Yields the list the pids
    terminated go into; leaving the block waits for the thread and raises what it raised
    (a :class:`TimeoutError` when no session held the key within ``timeout``)."""
    terminated: list[int] = []
    failures: list[BaseException] = []

    def terminate() -> None:
        try:
            terminated.extend(
                lose(dsn, key, timeout=timeout, namespace=namespace, registry=registry)
            )
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=terminate, name="pgsolo.testing:losing", daemon=True)
    thread.start()
    try:
        yield terminated
    finally:
        thread.join()
    if failures:
        raise failures[0]
