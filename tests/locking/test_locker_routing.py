"""A Locker's connections pass the checks of any session lock's, once each: behind a
transaction-pooling PgBouncer every lock is refused, and on a standby too, with nothing
taken and the Locker still usable for the next lock."""

from __future__ import annotations

from typing import Any

import pytest

import pgsolo
from _support import unique_name
from pgsolo import UnsafeConnectionError


def test_a_locker_behind_a_transaction_pooler_refuses_every_lock(
    bouncer: Any, observer: Any
) -> None:
    name = unique_name("locker-bouncer")
    with pgsolo.Locker(bouncer.dsn, max_connections=2) as locker:
        for i in range(3):
            lock = locker.session_lock(f"{name}-{i}")
            with pytest.raises(UnsafeConnectionError) as caught:
                lock.acquire()
            assert caught.value.reason == "transaction-pooling"
            assert not lock.acquired
            assert observer.holders(lock.key) == set()


def test_a_locker_on_a_standby_refuses_every_lock(replicas: Any) -> None:
    name = unique_name("locker-standby")
    with pgsolo.Locker(replicas.standby_dsn, max_connections=1) as locker:
        for i in range(2):
            lock = locker.session_lock(f"{name}-{i}", wait=1)
            with pytest.raises(UnsafeConnectionError) as caught:
                lock.acquire()
            assert caught.value.reason == "server-in-recovery"
            assert not lock.acquired
