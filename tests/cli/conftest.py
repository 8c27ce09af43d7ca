"""Fixtures of the command-line tests."""

from __future__ import annotations

import uuid

import pytest

from _support import pgsolo_cli


@pytest.fixture(scope="module")
def migrated(dsn: str) -> str:
    """The test database once ``pgsolo migrate`` has run on it (once per module)."""
    done = pgsolo_cli("migrate", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    return dsn


@pytest.fixture
def job() -> str:
    """A job name of the test's own."""
    return f"run-test-{uuid.uuid4().hex[:12]}"
