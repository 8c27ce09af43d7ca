"""psycopg 3 adapters, sync and async.

One round trip per call: when psycopg would not add a BEGIN of its own, the statements
go as one simple-query message; when it would (``autocommit=False`` and no transaction
open), they go in pipeline mode, so psycopg's BEGIN travels with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.rows import tuple_row

from . import ServerInfo, TxStatus

_STATUS = {
    pq.TransactionStatus.IDLE: TxStatus.IDLE,
    pq.TransactionStatus.ACTIVE: TxStatus.ACTIVE,
    pq.TransactionStatus.INTRANS: TxStatus.INTRANS,
    pq.TransactionStatus.INERROR: TxStatus.INERROR,
    pq.TransactionStatus.UNKNOWN: TxStatus.UNKNOWN,
}


class _PsycopgBase:
    _conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

    @property
    def connection(self) -> object:
        return self._conn

    @property
    def begins_implicitly(self) -> bool:
        return not self._conn.autocommit

    def transaction_status(self) -> TxStatus:
        if self._conn.closed:
            return TxStatus.UNKNOWN
        return _STATUS[self._conn.info.transaction_status]

    def backend_pid(self) -> int:
        return self._conn.info.backend_pid

    def server_info(self) -> ServerInfo:
        info = self._conn.info
        return ServerInfo(
            database=info.dbname,
            host=info.host,
            port=info.port,
            user=info.user,
            application_name=info.parameter_status("application_name") or "",
        )

    def sqlstate(self, exc: BaseException) -> str | None:
        return exc.sqlstate if isinstance(exc, psycopg.Error) else None

    def is_closed(self) -> bool:
        return self._conn.closed or self._conn.broken

    def _needs_pipeline(self) -> bool:
        return (
            not self._conn.autocommit
            and self._conn.info.transaction_status == pq.TransactionStatus.IDLE
            and psycopg.Pipeline.is_supported()
        )


def _has_row(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK and result.ntuples > 0


def _literal(statement: str) -> sql.SQL:
    # Statements come from pgsolo.sql only: fixed text and validated integers.
    return sql.SQL(statement)


class PsycopgDriver(_PsycopgBase):
    _conn: psycopg.Connection[Any]

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def _cursor(self) -> psycopg.Cursor[tuple[Any, ...]]:
        # The caller's connection may have any row factory; pgsolo reads plain tuples.
        return self._conn.cursor(row_factory=tuple_row)

    def fetch_value(self, statements: Sequence[str]) -> object:
        if self._needs_pipeline():
            with self._conn.pipeline():
                cursors = [self._cursor().execute(_literal(s)) for s in statements]
        else:
            cursors = [self._cursor().execute(_literal("; ".join(statements)))]
        value: object = None
        for cursor in cursors:
            while True:
                if _has_row(cursor) and (row := cursor.fetchone()) is not None:
                    value = row[0]
                if not cursor.nextset():
                    break
        return value


class AsyncPsycopgDriver(_PsycopgBase):
    _conn: psycopg.AsyncConnection[Any]

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    def _cursor(self) -> psycopg.AsyncCursor[tuple[Any, ...]]:
        return self._conn.cursor(row_factory=tuple_row)

    async def fetch_value(self, statements: Sequence[str]) -> object:
        if self._needs_pipeline():
            async with self._conn.pipeline():
                cursors = [await self._cursor().execute(_literal(s)) for s in statements]
        else:
            cursors = [await self._cursor().execute(_literal("; ".join(statements)))]
        value: object = None
        for cursor in cursors:
            while True:
                if _has_row(cursor) and (row := await cursor.fetchone()) is not None:
                    value = row[0]
                if not cursor.nextset():
                    break
        return value
