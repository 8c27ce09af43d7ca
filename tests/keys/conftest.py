"""Fixtures of the key tests."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


@pytest.fixture
def conn(connect: Any) -> psycopg.Connection:
    return connect()
