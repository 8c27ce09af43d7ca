"""What the monitor's modules share: one JSON snapshot per round trip, read back the same
way whatever the connection's encoding, and its times."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .. import sql
from ..drivers import DriverBase, SyncDriver
from ..errors import InvalidArgumentError
from ..locking import drive, outside_transaction
from ..locking.plans import Plan

__all__ = ["check_positive", "fetch_json", "format_seconds", "parse_time", "snapshot_plan"]


def check_positive(value: object, what: str, high: int = 2**31 - 1) -> None:
    """A positive int of at most ``high`` (a pid is an int32 on the server)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidArgumentError(f"{what} must be an int from 1 to {high}, got {value!r}")


def fetch_json(driver: SyncDriver, statements: list[str]) -> Mapping[str, Any]:
    return drive(snapshot_plan(driver, statements), driver)


def snapshot_plan(driver: DriverBase, statements: list[str]) -> Plan[Mapping[str, Any]]:
    """One round trip outside any transaction, answered by one JSON object."""
    value = sql.read_json((yield outside_transaction(driver, statements)))
    if not isinstance(value, Mapping):
        raise TypeError(f"the monitor's query returned {type(value).__name__}, not a JSON object")
    return value


def parse_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def format_seconds(seconds: float | None) -> str:
    """``4.2s``, ``12s``, ``3m05s``, ``2h10m``: a duration as people read it."""
    if seconds is None:
        return "?"
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
