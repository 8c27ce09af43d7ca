"""Fixtures of the lock tests (``_async/`` and its generated ``_sync/`` twins included)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg import sql as pgsql

from _support import Child


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    """Start :class:`Child` processes; those still running are killed afterwards."""
    started: list[Child] = []

    def start(script: str, *args: object) -> Child:
        child = Child(script, *args)
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()


@pytest.fixture
def table(observer: Any) -> Iterator[str]:
    """A real (not temporary) table, so the observer session can see what was committed."""
    name = f"pgsolo_work_{uuid.uuid4().hex[:12]}"
    observer.conn.execute(
        pgsql.SQL("CREATE TABLE {} (note text NOT NULL)").format(pgsql.Identifier(name))
    )
    yield name
    observer.conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(name)))
