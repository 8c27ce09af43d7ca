"""The Django adapter: ``django.db.connection`` or ``connections[alias]`` of the
postgresql backend (psycopg 3 or psycopg2 under it).

The statements go to Django's DBAPI connection through the adapter of its library (this
module only decides what Django must know). The transaction is Django's:

- inside ``transaction.atomic()`` the connection is in a transaction (even before the
  DBAPI connection has begun one), so a transaction lock joins Django's and lasts until
  the outermost ``atomic`` ends; pgsolo never commits or rolls it back;
- outside, ``with xact_lock(connection, ...)`` opens pgsolo's own transaction as a durable
  ``atomic`` of Django's and leaves it exactly once: committed at the end of the block,
  rolled back (``set_rollback``) on a failure, even when the connection died meanwhile;
- at the end of a request (``request_finished``) the session locks pgsolo still holds on
  a connection are released with a warning (:data:`pgsolo.drivers.REQUEST_END_HOOKS`), so
  that a persistent connection (``CONN_MAX_AGE``) never carries one into the next request;
  a later ``release()`` of such a lock reports it lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import request_finished
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db import Error as DjangoError
from django.db import connection as default_connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionDoesNotExist

from .._acompat import Event
from .._logging import drivers_logger as logger
from ..errors import DatabaseUnavailableError, UnsupportedConnectionError, UsageError
from . import (
    REQUEST_END_HOOKS,
    Edge,
    IdleByStatus,
    Lacking,
    News,
    ServerInfo,
    SyncDriver,
    SyncHeartbeat,
    TxStatus,
    adapt_sync,
    heartbeat_of,
)

__all__ = ["DjangoDriver", "adapt", "command_error", "connection_of"]


def adapt(connection: object) -> SyncDriver | None:
    """The adapter of a Django connection of the postgresql backend; None for other
    Django objects."""
    if connection is default_connection:  # a proxy of this thread's connections[default]
        connection = connections[DEFAULT_DB_ALIAS]
    if not isinstance(connection, BaseDatabaseWrapper):
        return None
    if connection.vendor != "postgresql":
        raise UnsupportedConnectionError(
            f"pgsolo takes a Django connection of the postgresql backend; connection"
            f" {connection.alias!r} is {connection.vendor}"
        )
    return DjangoDriver(connection)


def connection_of(alias: str) -> BaseDatabaseWrapper:
    """``connections[alias]``, this thread's connection of the alias; an alias that
    ``settings.DATABASES`` lacks, or settings not configured yet, is a
    :class:`~pgsolo.UsageError` (no connection is opened: Django connects at the first
    statement)."""
    if not isinstance(alias, str) or not alias:
        raise UsageError(f"using= takes an alias of Django's settings.DATABASES, got {alias!r}")
    try:
        return connections[alias]
    except ConnectionDoesNotExist:
        known = ", ".join(repr(name) for name in connections)
        raise UsageError(
            f"using={alias!r} is not a database of Django's settings.DATABASES (it has {known})"
        ) from None
    except ImproperlyConfigured as exc:
        raise UsageError(
            f"using={alias!r} needs Django's settings, and they are not configured"
            f" (DJANGO_SETTINGS_MODULE, or settings.configure() then django.setup()): {exc}"
        ) from None


def command_error(message: str, returncode: int) -> Exception:
    """Django's ``CommandError``: ``manage.py`` prints it on one line of stderr and exits
    ``returncode``; ``call_command()`` raises it to its caller."""
    # Imported here: a web process that only takes locks never loads the commands' machinery.
    from django.core.management import CommandError  # noqa: PLC0415

    error: Exception = CommandError(message, returncode=returncode)
    return error


class DjangoDriver(IdleByStatus):
    """pgsolo's driver protocol (:class:`~pgsolo.drivers.SyncDriver`) on a Django
    ``DatabaseWrapper``. The wrapper (one per thread and alias) is what pgsolo tracks
    held locks by; the DBAPI connection under it changes when Django reconnects."""

    is_async: ClassVar[bool] = False
    lone_calls: ClassVar[None] = None  # every round trip is fetch_value's
    ends_by_message: ClassVar[bool] = False

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self._wrapper = wrapper
        self._dbapi: object = None
        self._inner: SyncDriver | None = None
        # The durable atomic block of pgsolo's own transaction, while it is open.
        self._atomic: transaction.Atomic | None = None

    @property
    def connection(self) -> object:
        return self._wrapper

    session_locks_refused: ClassVar[str | None] = None
    transaction_hint: ClassVar[str] = "with transaction.atomic():"
    ending_advice: ClassVar[str] = (
        "call it outside transaction.atomic(); in a view under ATOMIC_REQUESTS, decorate the"
        " view with @transaction.non_atomic_requests"
    )

    def heartbeat(self) -> SyncHeartbeat | Lacking:
        found = self._driver().heartbeat()  # the DBAPI connection's library decides
        return found if isinstance(found, Lacking) else self

    def _driver(self, *, connect: bool = True) -> SyncDriver:
        """The adapter of the DBAPI connection under Django's, connecting first when
        ``connect``; otherwise the last one (which reports a closed connection)."""
        if connect and self._wrapper.connection is None:
            self._connect()
        dbapi = self._wrapper.connection
        if dbapi is not None and dbapi is not self._dbapi:
            self._dbapi, self._inner = dbapi, adapt_sync(dbapi)
        if self._inner is None:  # never connected, and not asked to
            return self._driver(connect=True)
        return self._inner

    def _connected(self) -> bool:
        return self._wrapper.connection is not None

    def _connect(self) -> None:
        """Django's connect, undone if cut short. ``connect()`` keeps the new DBAPI
        connection before it configures the session (time zone, role, autocommit): a Ctrl-C
        between the two would leave a connection Django takes for ready. The caller handed
        a closed one, so it gets a closed one back, and Django connects afresh at its next
        statement."""
        wrapper = self._wrapper
        try:
            wrapper.ensure_connection()
        except BaseException as exc:
            self._close_half_made()
            if isinstance(exc, DjangoError):  # as pgsolo, never as the driver (module doc)
                raise DatabaseUnavailableError(
                    f"Django could not connect to its database {wrapper.alias!r}"
                    f" ({self._without_password(' '.join(str(exc).split()))}); nothing is held"
                ) from exc
            raise

    def _without_password(self, text: str) -> str:
        """``text`` with the password of Django's settings for the database blanked out."""
        password = str(self._wrapper.settings_dict.get("PASSWORD") or "")
        return text.replace(password, "***") if password else text

    def _close_half_made(self) -> None:
        """Close the connection a connect of pgsolo's opened and did not finish making."""
        if self._wrapper.connection is not None:
            with contextlib.suppress(Exception):
                self._wrapper.close()

    @property
    def begins_implicitly(self) -> bool:
        # Outside atomic Django runs in autocommit, unless AUTOCOMMIT is off in settings:
        # then the DBAPI connection begins by itself, and the caller commits.
        return not self._wrapper.in_atomic_block and self._driver().begins_implicitly

    def transaction_status(self) -> TxStatus:
        wrapper = self._wrapper
        if not self._connected():
            if wrapper.in_atomic_block:
                # Closed inside atomic: the transaction is gone, and Django will not
                # open a new connection before the atomic ends.
                return TxStatus.UNKNOWN if wrapper.closed_in_transaction else TxStatus.INTRANS
            return TxStatus.IDLE  # Django connects on the first statement
        status = self._driver(connect=False).transaction_status()
        if status is TxStatus.UNKNOWN:
            self._mark_unusable()
        if status in (TxStatus.INERROR, TxStatus.UNKNOWN, TxStatus.ACTIVE):
            return status
        if wrapper.in_atomic_block:
            # Django refuses every statement once the block must roll back.
            return TxStatus.INERROR if wrapper.needs_rollback else TxStatus.INTRANS
        return status

    def backend_pid(self) -> int:
        return self._driver(connect=self._connected()).backend_pid()

    def server_info(self) -> ServerInfo:
        return self._driver(connect=self._connected()).server_info()

    def sqlstate(self, exc: BaseException) -> str | None:
        return self._driver(connect=False).sqlstate(_drivers_error(exc))

    def error_detail(self, exc: BaseException) -> str | None:
        return self._driver(connect=False).error_detail(_drivers_error(exc))

    def is_closed(self) -> bool:
        if not self._connected():
            return True
        if self._driver(connect=False).is_closed():
            self._mark_unusable()
            return True
        return False

    def _mark_unusable(self) -> None:
        """The DBAPI connection is dead, as pgsolo found (a keeper's watch, which Django
        never saw): on Django's books too, so that Django closes it when the request ends
        (``close_if_unusable_or_obsolete``) and the next request connects anew."""
        self._wrapper.errors_occurred = True

    def scrub(self, text: str) -> str:
        return self._driver(connect=False).scrub(text)

    def client_address(self) -> tuple[str, int] | None:
        return self._driver().client_address()

    def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        return self._driver().fetch_value_elsewhere(statements)

    def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        if self._wrapper.in_atomic_block or not self._connected():
            return None  # Django's transaction is open (or a statement opens one)
        return heartbeat_of(self._driver(connect=False).heartbeat()).beat(statement, answer_within)

    def wait_for_news(self, seconds: float, stopping: Event) -> News:
        # No check of Django's transaction, unlike a beat (which would run in it): reading
        # runs no statement, and the driver under it decides by the connection itself.
        if not self._connected():
            stopping.wait(seconds)  # no DBAPI connection to watch until the beat
            return "quiet"
        inner = heartbeat_of(self._driver(connect=False).heartbeat())
        return inner.wait_for_news(seconds, stopping)

    def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        if edge is None:
            return self._send(statements, wait)
        if edge == "begin":
            if self._wrapper.connection is None:  # here, not in Django's atomic
                self._connect()
            atomic = transaction.atomic(using=self._wrapper.alias, durable=True)
            try:
                atomic.__enter__()
            except BaseException:
                self._abandon_interrupted_enter(atomic)
                raise
            self._atomic = atomic
            # A failure here is followed by pgsolo's rollback edge, which leaves it.
            return self._send(statements, wait)
        return self._end(statements, wait, commit=edge == "commit")

    def _abandon_interrupted_enter(self, atomic: transaction.Atomic) -> None:
        """Undo what Django's atomic did on its way in before a Ctrl-C cut it short. Its
        health check (a ``SELECT 1`` before it switches autocommit off) so cut left the
        connection ACTIVE: the statement is read to its end, and autocommit is back on if
        it was switched off; an atomic that got in all but its last lines is left, rolled
        back. The rollback edge that follows finds no atomic of pgsolo's to leave."""
        wrapper = self._wrapper
        try:
            if atomic in wrapper.atomic_blocks:
                transaction.set_rollback(True, using=wrapper.alias)
                atomic.__exit__(None, None, None)
                return
            if wrapper.connection is None or wrapper.in_atomic_block:
                return
            if self.transaction_status() is TxStatus.UNKNOWN:  # reads an ACTIVE one first
                wrapper.close()
            elif not wrapper.autocommit:
                wrapper.set_autocommit(True)
        except Exception as exc:
            logger.warning("pgsolo: undoing an interrupted start of a transaction failed: %r", exc)
            with contextlib.suppress(Exception):
                wrapper.close()

    def _send(self, statements: Sequence[str], wait: float) -> object:
        """Send ``statements`` as Django's own cursor would: a failure is Django's error
        (the driver's is its cause). On Django's books (``errors_occurred``) only if the
        connection died, so that Django closes it when the request ends and the next
        request connects anew; an answer such as a lock timeout leaves a live connection,
        and Django's books, as they were (Django would check it with a round trip)."""
        wrapper = self._wrapper
        occurred = wrapper.errors_occurred
        try:
            with wrapper.wrap_database_errors:
                return self._driver().fetch_value(statements, wait)
        except DjangoError:
            if not self.is_closed():  # which marks a dead one
                wrapper.errors_occurred = occurred
            raise

    def _end(self, statements: Sequence[str], wait: float, *, commit: bool) -> object:
        """Send ``statements`` and leave pgsolo's atomic block: commit it, or roll it back
        (also when the statements fail). Left once: a later rollback edge finds it gone."""
        atomic, self._atomic = self._atomic, None
        try:
            value = self._send(statements, wait) if statements else None
        except BaseException:
            if atomic is not None:
                self._leave(atomic, commit=False)
            raise
        if atomic is not None:
            self._leave(atomic, commit=commit)
        return value

    def _leave(self, atomic: transaction.Atomic, *, commit: bool) -> None:
        if not commit:
            transaction.set_rollback(True, using=self._wrapper.alias)
        try:
            # Django rolls back when the block must (and on a dead connection closes it).
            atomic.__exit__(None, None, None)
        except BaseException as exc:
            interrupt = _interrupt_behind(exc)
            if interrupt is None:
                raise
            self._finish_interrupted_leave(atomic, commit=commit)
            raise interrupt from None

    def _finish_interrupted_leave(self, atomic: transaction.Atomic, *, commit: bool) -> None:
        """Do what a Ctrl-C kept Django's atomic from doing on its way out. Cut before it
        began, it is left again, rolled back. Cut in its COMMIT or ROLLBACK, it left the
        driver's connection ACTIVE; its ``finally`` then failed to switch autocommit back
        on, so Django's books said "no autocommit" outside any block, and the caller's
        next statement found the connection unusable. The statement is read to its end;
        what it did decides the rest: a COMMIT the server ran is recorded as Django's
        ``commit()`` would (its ``on_commit`` callbacks run), a transaction still open is
        rolled back (its callbacks dropped), and a connection that cannot be saved is
        closed, on Django's books too."""
        wrapper = self._wrapper
        if atomic in wrapper.atomic_blocks:  # cut before it began: the Ctrl-C came first
            commit = False
            with contextlib.suppress(Exception):
                transaction.set_rollback(True, using=wrapper.alias)
                atomic.__exit__(None, None, None)
        elif wrapper.in_atomic_block and not wrapper.atomic_blocks:
            # Cut between taking itself off the list and saying it is out (pgsolo's atomic
            # is the outermost, durable one): the line it did not reach.
            commit = False
            wrapper.in_atomic_block = False
        if wrapper.in_atomic_block or wrapper.connection is None:
            return
        try:
            status = self.transaction_status()  # reads an ACTIVE statement to its end
            if status is TxStatus.UNKNOWN:
                wrapper.close()
                return
            if status is not TxStatus.IDLE:
                wrapper.rollback()
            elif commit:
                wrapper.run_commit_hooks_on_set_autocommit_on = True
            else:
                wrapper.run_on_commit = []
            if wrapper.commit_on_exit and not wrapper.autocommit:
                wrapper.set_autocommit(True)
        except Exception as exc:
            logger.warning("pgsolo: finishing an interrupted transaction failed: %r", exc)
            with contextlib.suppress(Exception):  # it is closed, or closing it fails too
                wrapper.close()


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The interrupt (a Ctrl-C) ``exc`` is, or the one it was raised while handling:
    Django's atomic raises its own error from its ``finally`` when an interrupt left the
    connection unusable, and that error must not stand in for the Ctrl-C."""
    seen: BaseException | None = exc
    while seen is not None:
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return None


def _drivers_error(exc: BaseException) -> BaseException:
    """The driver's error under Django's (``wrap_database_errors`` raises Django's class
    from the driver's), which is what the driver under Django reads."""
    cause = exc.__cause__ if isinstance(exc, DjangoError) else None
    return cause if isinstance(cause, BaseException) else exc


def _request_finished(sender: object, **kwargs: Any) -> None:
    """Release the session locks pgsolo still holds on this thread's connections."""
    for wrapper in connections.all(initialized_only=True):
        if wrapper.vendor != "postgresql":
            continue
        driver = DjangoDriver(wrapper)
        for hook in REQUEST_END_HOOKS:
            try:
                hook(driver)
            except Exception as exc:  # a request's end must not fail for it
                logger.warning(
                    "pgsolo: releasing session locks at the end of a request failed: %r", exc
                )


# After Django's own handler (connected when django.db was imported): a connection it
# closed has lost its locks already, and pgsolo only takes them off its books.
request_finished.connect(_request_finished, dispatch_uid="pgsolo.request_finished")
