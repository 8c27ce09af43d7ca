"""Helpers shared by the test modules (imported as ``_support``; pytest puts this
directory on ``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


def eventually(predicate: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
