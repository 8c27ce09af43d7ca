"""The small types every layer shares: lifetimes, outcomes, periods and durations.

Pure: no I/O. Periods and durations are checked here, where they are given, before any
SQL is sent: a duration that reaches the server or a timer unchecked fails far from where
it was given (``Keep(interval=1e10)`` used to kill the keeper's thread with an
``OverflowError``, leaving the lock unwatched; ``timeout=1e300`` turned every beat into a
false loss; an ``N seconds`` period the server cannot hold failed only once the work had
its lock). So every duration of the public API (``wait=``, ``Keep(interval, timeout)``,
``period=``, ``doctor(older_than=)``, the command line's seconds) goes through
:func:`check_seconds`, and every period through :func:`check_period`.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias

from .errors import InvalidArgumentError

__all__ = [
    "DAY",
    "MAX_PERIOD_SECONDS",
    "PERIOD_UNITS",
    "Lifetime",
    "OnceOutcome",
    "Outcome",
    "check_period",
    "check_seconds",
    "parse_period_seconds",
]

Lifetime: TypeAlias = Literal["xact", "session"]

"""``xact`` (released at COMMIT or ROLLBACK) or ``session`` (held until unlocked or the
session ends)."""

Outcome: TypeAlias = Literal["completed", "skipped", "failed", "lost"]

"""What one attempt at a job ended as (a skip is never a success)."""

OnceOutcome: TypeAlias = Literal["ran", "already-succeeded", "skipped-busy"]

"""What one call of ``run_once`` found or did."""


# -- durations ---------------------------------------------------------------------------

DAY = 86_400.0


def check_seconds(
    name: str, value: object, low: float, high: float, *, above_low: bool = False
) -> float:
    """``value`` as a float number of seconds in [``low``, ``high``] (or (``low``,
    ``high``] with ``above_low``), or :class:`~pgsolo.InvalidArgumentError` naming
    ``name`` and the range. Refuses ``bool``, anything that is not an ``int`` or a
    ``float``, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(
            f"{name} must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    in_range = (seconds > low if above_low else seconds >= low) and seconds <= high
    if not math.isfinite(seconds) or not in_range:
        lowest = f"more than {_number(low)}" if above_low else f"at least {_number(low)}"
        raise InvalidArgumentError(
            f"{name} must be {lowest} and at most {_number(high)} seconds, got {value!r}"
        )
    return seconds


def _number(value: float) -> str:
    """``2147483``, not ``2.14748e+06``: a bound is read by people."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# -- periods -----------------------------------------------------------------------------

PERIOD_UNITS = ("minute", "hour", "day", "week", "month", "year")


MAX_PERIOD_SECONDS = 100 * 365 * 86_400  # 100 years of 365 days: 3153600000


def parse_period_seconds(period: object) -> int:
    """``"900 seconds"`` -> 900; anything else raises
    :class:`~pgsolo.InvalidArgumentError` (a ``ValueError``). N is from 1 to
    :data:`MAX_PERIOD_SECONDS`, so that the server can always hold the interval."""
    text = period if isinstance(period, str) else ""
    number, _, unit = text.partition(" ")
    if unit != "seconds" or not number.isascii() or not number.isdigit():
        raise InvalidArgumentError(
            f"a period is one of {', '.join(PERIOD_UNITS)} or 'N seconds' (N from 1 to"
            f" {MAX_PERIOD_SECONDS}, 100 years), got {period!r}"
        )
    digits = number.lstrip("0") or "0"
    # More digits than any allowed N: too large, without parsing a huge number.
    value = int(digits) if len(digits) <= len(str(MAX_PERIOD_SECONDS)) else MAX_PERIOD_SECONDS + 1
    check_seconds("a period of 'N seconds'", value, 1, MAX_PERIOD_SECONDS)
    return value


def check_period(period: object) -> str:
    """``period`` if it is a unit (``minute`` ... ``year``, in UTC) or ``"N seconds"`` the
    server can hold; :class:`~pgsolo.InvalidArgumentError` otherwise."""
    if period in PERIOD_UNITS:
        return str(period)
    parse_period_seconds(period)
    return str(period)
