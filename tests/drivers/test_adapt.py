"""Which adapter a connection gets: chosen by the connection's type, importing only the
library it belongs to, and a typed error naming what pgsolo takes for anything else."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg_pool
import pytest

import pgsolo
from _support import Connect
from pgsolo import Key
from pgsolo.drivers.registry import LIBRARIES

OPTIONAL = tuple(library.package for library in LIBRARIES if not library.required)


@pytest.mark.parametrize("thing", [object(), 42, "postgresql://localhost/app", None], ids=repr)
def test_anything_else_is_refused_with_what_is_supported(thing: object, key: Key) -> None:
    with pytest.raises(pgsolo.UnsupportedConnectionError) as refused:
        pgsolo.session_lock(thing, key)  # type: ignore[call-overload]
    assert isinstance(refused.value, TypeError)  # code that caught TypeError still does
    message = str(refused.value)
    for library in LIBRARIES:
        assert library.takes in message
    assert type(thing).__qualname__ in message


def test_a_dsn_or_a_pool_is_refused_with_what_to_pass_instead(dsn: str, key: Key) -> None:
    with pytest.raises(pgsolo.UnsupportedConnectionError, match="a DSN is not a connection") as e:
        pgsolo.is_locked(dsn, key)  # type: ignore[arg-type]
    assert dsn not in str(e.value)  # never echoed: a DSN can hold a password
    with (
        psycopg_pool.ConnectionPool(dsn, min_size=1, open=True) as pool,
        pytest.raises(pgsolo.UnsupportedConnectionError, match=r"pool\.connection\(\)"),
    ):
        pgsolo.session_lock(pool, key)  # type: ignore[call-overload]


def test_a_cursor_of_a_supported_library_is_refused(connect: Connect, key: Key) -> None:
    conn = connect()
    with conn.cursor() as cur, pytest.raises(pgsolo.UnsupportedConnectionError) as refused:
        pgsolo.xact_lock(cur, key)  # type: ignore[call-overload]
    assert "psycopg.Cursor" in str(refused.value)


async def test_a_sync_connection_in_an_async_call_is_refused(connect: Connect, key: Key) -> None:
    conn: Any = connect()
    with pytest.raises(pgsolo.UnsupportedConnectionError, match="async"):
        await pgsolo.run_job_async(conn, key, lambda c: None)


def test_importing_pgsolo_imports_no_optional_library(dsn: str) -> None:
    """A user who did not install an extra never pays for it, and one who did only when
    one of its connections arrives."""
    code = (
        "import sys, pgsolo, psycopg\n"
        "conn = psycopg.connect(sys.argv[1], autocommit=True)\n"
        "with pgsolo.xact_lock(conn, 1) as lock: assert lock.acquired\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, dsn], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
