"""The psycopg 3 adapter of an async connection; see :mod:`pgsolo.drivers._psycopg`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
from psycopg.rows import tuple_row

from ... import sql
from ..._acompat import AIS_ASYNC, AEvent, arun_blocking, atry_lock
from .. import AsyncHeartbeat, Edge, Lacking, News, edged
from .._psycopg import (
    ANSWER_WITHIN,
    PsycopgBase,
    bound_answers,
    exchange_beat,
    in_pipeline_mode,
    message,
    read_news,
    row_value,
    transaction_start,
    watched_socket,
)
from .._psycopg_acompat import around_trip

__all__ = ["AsyncPsycopgDriver"]


class AsyncPsycopgDriver(PsycopgBase):
    """pgsolo's driver protocol (:class:`~pgsolo.drivers.AsyncDriver`) on a psycopg
    ``AsyncConnection``."""

    is_async: ClassVar[bool] = AIS_ASYNC
    lone_calls: ClassVar[None] = None  # every round trip is fetch_value's
    transaction_hint: ClassVar[str] = "async with conn.transaction():"
    _conn: psycopg.AsyncConnection[Any]

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn.pgconn.pipeline_status:  # before any SQL; a read of libpq's, no call
            raise in_pipeline_mode()
        self._conn = self.connection = conn
        self._bound = ANSWER_WITHIN.get(conn)

    async def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        if self._conn.pgconn.pipeline_status:  # entered since the lock was taken
            raise in_pipeline_mode()
        sent = statements
        if edge is not None:
            sent = edged(statements, edge, self)
            conn = self._conn
            if edge == "begin" and (
                conn.isolation_level is not None
                or conn.read_only is not None
                or conn.deferrable is not None
            ):  # pgsolo's BEGIN (autocommit): as the caller's own transaction would begin
                sent = [transaction_start(conn) if s == sql.BEGIN else s for s in sent]
        if not sent:  # an edge a transaction that begins by itself needs no statement for
            return None
        return await around_trip(self._conn, wait, sent, self._fetch_by_cursor, self._bound)

    async def _fetch_by_cursor(self, statements: Sequence[str]) -> object:
        # The caller's connection may have any row factory and loaders: pgsolo reads each
        # result itself (row_value). Never prepared: psycopg counts a statement's runs to
        # prepare it, and a run interrupted before it looked at the results (Ctrl-C) stays
        # counted, so a message of several statements would be prepared, which the server
        # refuses.
        cursor = self._conn.cursor(row_factory=tuple_row)  # the caller's never runs on ours
        await cursor.execute(message(statements), prepare=False)
        value: object = None
        while True:
            value = row_value(self._conn, cursor.pgresult, value)
            if not cursor.nextset():
                return value

    async def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        async with await psycopg.AsyncConnection.connect(
            self._elsewhere_conninfo(), autocommit=True
        ) as other:
            bound_answers(other, self._answer_within())
            return await AsyncPsycopgDriver(other).fetch_value(statements)

    def heartbeat(self) -> AsyncHeartbeat | Lacking:
        return self

    async def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        # psycopg's own lock: while the keeper holds it, no statement of the caller's can
        # start on this connection, and the keeper never waits for it. libpq is called
        # directly, in a worker thread for a task; the connection stays locked until the
        # exchange is over, even if the keeper is cancelled meanwhile.
        async with atry_lock(self._conn.lock) as taken:
            if not taken or not self._beat_ready():
                return None
            with self._beating():
                pgconn = self._conn.pgconn
                return await arun_blocking(exchange_beat, pgconn, statement, answer_within)

    async def wait_for_news(self, seconds: float, stopping: AEvent) -> News:
        # The duplicate is waited on without psycopg's lock, so the caller's statements go
        # on meanwhile. Once it is readable, the input is read only under the same
        # conditions as a beat: if the caller's statement is in flight, the bytes are its
        # answer, which only the caller may read.
        sock = watched_socket(self._conn.pgconn)
        try:
            if not await stopping.wait_readable(sock.fileno(), seconds):
                return "quiet"
        finally:
            sock.close()
        async with atry_lock(self._conn.lock) as taken:
            if not taken or not self._news_ready():
                return "busy"
            return read_news(self._conn.pgconn)
