"""Durations: the one check for every number of seconds pgsolo takes.

A duration that reaches the server or a timer unchecked fails far from where it was
given: ``Keep(interval=1e10)`` used to kill the keeper's thread with an ``OverflowError``
(leaving the lock unwatched), ``timeout=1e300`` turned every beat into a false loss, and an
``N seconds`` period the server cannot hold failed only once the work had its lock. So
every duration of the public API (``wait=``, ``Keep(interval, timeout)``, ``period=``,
``doctor(older_than=)``, the command line's seconds) goes through :func:`check_seconds`
when it is given, before any SQL is sent. Pure: no I/O.
"""

from __future__ import annotations

import math

from .errors import InvalidArgumentError

__all__ = ["DAY", "check_seconds"]

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
