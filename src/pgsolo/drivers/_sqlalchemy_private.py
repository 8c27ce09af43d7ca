"""The one place pgsolo reads SQLAlchemy's private attributes: those of its asyncpg
dialect's DBAPI adapter (``AsyncAdapt_asyncpg_connection``), which starts its asyncpg
``Transaction`` lazily, at its first statement, and says so nowhere public. Checked on
SQLAlchemy 2.0.55 to 2.1.9, the range pyproject.toml allows; `nox -s lowest` runs the
driver tests on the lowest, CI's suite on the newest.

The public way to make the adapter start it is a statement of SQLAlchemy's own (say
``exec_driver_sql("SELECT 1")``): BEGIN and then that statement, each time pgsolo's
statements come first in a transaction. Measured through a proxy that delays each reply by
5 ms: 2 round trips and 15 ms against 1 and 8 ms (more the first time, when asyncpg
prepares the statement); and a cancellation meanwhile would make SQLAlchemy invalidate the
caller's connection.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

__all__ = ["start_transaction", "transaction_not_started"]


def transaction_not_started(dbapi: Any) -> bool:
    """Whether ``dbapi`` is SQLAlchemy's asyncpg adapter, outside autocommit, that has not
    started its asyncpg transaction yet (False for the other dialects' connections)."""
    return (
        getattr(dbapi, "_transaction", False) is None
        and not getattr(dbapi, "autocommit", True)
        and hasattr(dbapi, "_start_transaction")
    )


def start_transaction(dbapi: Any) -> Awaitable[None]:
    """What the adapter runs before its first statement: asyncpg's ``Transaction.start()``
    (BEGIN), recorded as the adapter's once it returned."""
    started: Awaitable[None] = dbapi._start_transaction()
    return started
