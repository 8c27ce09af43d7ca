"""A session Lock object re-used after release never shows the previous acquisition's
fencing token."""

from __future__ import annotations

from typing import Any

import psycopg

from pgsolo import session_lock


def test_a_busy_retry_does_not_show_the_previous_acquisitions_token(db: str, key: Any) -> None:
    with (
        psycopg.connect(db, autocommit=True) as conn,
        psycopg.connect(db, autocommit=True) as other,
    ):
        lock = session_lock(conn, key, fencing=True)
        assert lock.acquire()
        old = lock.token
        lock.release()
        other.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        assert lock.acquire() is False  # busy: nothing held, no token issued
        assert lock.token is None, f"busy try still shows token {old} of a released hold"
