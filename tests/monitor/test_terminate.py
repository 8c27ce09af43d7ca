"""``terminate_backend()``: it releases what the backend held, and refuses the caller's
own connection before any SQL.
"""

from __future__ import annotations

import pgsolo
from _support import Connect
from pgsolo import (
    Key,
    UsageError,
    advisory_locks,
)
from pgsolo.monitor import terminate_backend


def test_terminate_backend_releases_what_it_held(connect: Connect, observer: object) -> None:
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(7100004, 1)")
    monitor = connect()
    assert pgsolo.terminate_backend(monitor, holder.info.backend_pid) is True
    assert observer.holders(Key((7100004, 1))) == set()  # type: ignore[attr-defined]
    assert advisory_locks(monitor, pid=holder.info.backend_pid) == []


# -- found in review -----------------------------------------------------------------------


def test_terminate_backend_refuses_its_own_connection_before_any_sql(connect: Connect) -> None:
    """The CLI refuses its own pid; the Python API sends pg_terminate_backend(own pid),
    which kills the caller's own connection and surfaces as a raw OperationalError."""

    conn = connect()
    try:
        terminate_backend(conn, conn.info.backend_pid)
    except UsageError:
        pass
    except Exception as exc:
        raise AssertionError(f"not a typed usage error: {exc!r}") from exc
    else:
        raise AssertionError("terminated its own session and returned")
    assert not conn.closed
