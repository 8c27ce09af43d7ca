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
import re
from typing import Literal, NamedTuple, TypeAlias

from .errors import InvalidArgumentError

__all__ = [
    "DAY",
    "MAX_PERIOD_SECONDS",
    "MAX_WAIT_SECONDS",
    "PERIOD_UNITS",
    "Lifetime",
    "OnceOutcome",
    "Outcome",
    "Period",
    "check_period",
    "check_seconds",
    "check_timezone",
    "read_period",
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
# The longest lock wait: lock_timeout is an int of milliseconds on the server. Here, not in
# pgsolo.locking, so that the command line checks --wait without loading the lock layer.
MAX_WAIT_SECONDS = 2_147_483


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


# The calendar units' other spellings, as cron users and schedulers write them.
_CALENDAR = {
    **{unit: unit for unit in PERIOD_UNITS},
    "minutely": "minute",
    "hourly": "hour",
    "daily": "day",
    "weekly": "week",
    "monthly": "month",
    "yearly": "year",
    "annually": "year",
}


# Units of a fixed number of seconds. Months and years are not: they exist only as
# calendar periods. "m" is minutes, as in 90m (a month has no short form).
_SECONDS_PER = {
    **dict.fromkeys(("s", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3_600),
    **dict.fromkeys(("d", "day", "days"), 86_400),
    **dict.fromkeys(("w", "week", "weeks"), 604_800),
}


_FIXED = re.compile(r"(?P<n>[0-9]+)(?:(?P<short>s|m|min|h|d|w)|(?: (?P<long>[a-z]+)))?", re.ASCII)


_ZONED = re.compile(r"(?P<unit>[a-z]+) in (?P<zone>.+)", re.ASCII | re.DOTALL)


# An IANA time zone name (Europe/Paris, America/Argentina/Buenos_Aires, Etc/GMT+5): this
# check comes before the name is looked up, and is why it can be quoted in SQL as it is.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*", re.ASCII)


# The names tzdata gives UTC (and GMT, the same offset for ever): every one of them is the
# plain period's, so that a change of spelling never starts a second record of one day.
_UTC = frozenset(
    {
        *("UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich"),
        *("Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "Etc/GMT", "Etc/GMT0"),
        *("Etc/GMT+0", "Etc/GMT-0", "Etc/Greenwich"),
    }
)


_SPELLINGS = (
    "a period is a calendar period, minute, hour, day, week, month or year (also minutely,"
    " hourly, daily, weekly, monthly, yearly, annually: in UTC, or in a time zone for day,"
    " week, month and year), or a number of seconds N from 1 to"
    f" {MAX_PERIOD_SECONDS} (100 years) written 900, 900s, '900 seconds', 15m, 24h, 1d,"
    " 2w or '3 days', counted from the Unix epoch"
)


class Period(NamedTuple):
    """A period read by :func:`read_period`: a calendar ``unit`` (in ``zone``, None for
    UTC), or a fixed number of ``seconds``."""

    unit: str | None
    seconds: int | None
    zone: str | None

    @property
    def text(self) -> str:
        """The one spelling pgsolo stores and shows: ``day``, ``day in Europe/Paris``,
        ``86400 seconds``. Every spelling of a period is recorded under it."""
        if self.seconds is not None:
            return f"{self.seconds} seconds"
        return f"{self.unit} in {self.zone}" if self.zone else str(self.unit)


def read_period(period: object) -> Period:
    """Any spelling of a period (:data:`_SPELLINGS`; ``"day in Europe/Paris"`` too), or
    :class:`~pgsolo.InvalidArgumentError` (a ``ValueError``)."""
    text = period if isinstance(period, str) else ""
    if unit := _CALENDAR.get(text):
        return Period(unit, None, None)
    if zoned := _ZONED.fullmatch(text):
        return _in_zone(read_period(zoned["unit"]), zoned["zone"])
    fixed = _FIXED.fullmatch(text)
    per = _SECONDS_PER.get(fixed["short"] or fixed["long"] or "s") if fixed else None
    if fixed is None or per is None:
        raise InvalidArgumentError(f"{_SPELLINGS}; got {period!r}")
    digits = fixed["n"].lstrip("0") or "0"
    # More digits than any allowed N: too large, without parsing a huge number.
    too_many = len(digits) > len(str(MAX_PERIOD_SECONDS))
    value = MAX_PERIOD_SECONDS + 1 if too_many else int(digits) * per
    if not 1 <= value <= MAX_PERIOD_SECONDS:
        raise InvalidArgumentError(
            f"a period of a number of seconds must be from 1 to {MAX_PERIOD_SECONDS}"
            f" (100 years), got {period!r}"
        )
    return Period(None, value, None)


def check_timezone(zone: object) -> str | None:
    """``zone`` if it is an IANA time zone name (Python's ``zoneinfo`` knows it), None
    for UTC; :class:`~pgsolo.InvalidArgumentError` otherwise."""
    if not isinstance(zone, str) or not _ZONE_NAME.fullmatch(zone):
        raise InvalidArgumentError(
            f"a time zone is an IANA name such as Europe/Paris or America/New_York, got {zone!r}"
        )
    import zoneinfo  # noqa: PLC0415 - only for a period in a time zone

    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgumentError(
            f"unknown time zone {zone!r}: an IANA name such as Europe/Paris or"
            " America/New_York (the names zoneinfo and PostgreSQL know)"
        ) from None
    if zone in _UTC:
        return None
    if "/" not in zone:
        # PostgreSQL reads a zone's name as an abbreviation first, with the fixed offset
        # the session's timezone_abbreviations give it: EST is -5 in one set and +10 in
        # another, CET never has summer time, and two hosts would each run the same day.
        raise InvalidArgumentError(
            f"time zone {zone!r} has no region, and PostgreSQL may read such a name as an"
            " abbreviation with a fixed offset, which depends on each session's"
            " timezone_abbreviations: give its region/city name, such as Europe/Paris or"
            " America/New_York"
        )
    return zone


def _in_zone(period: Period, zone: object) -> Period:
    """``period`` in time zone ``zone``: a day, week, month or year starts at midnight
    there, so a day may last 23 or 25 hours; other periods are UTC's only."""
    name = check_timezone(zone)
    if name is None or period.zone == name:
        return period
    if period.zone is not None:
        raise InvalidArgumentError(
            f"the period {period.text!r} is already in a time zone; got time zone {zone!r} too"
        )
    if period.unit not in ("day", "week", "month", "year"):
        what = f"{period.unit}s" if period.unit else "numbers of seconds"
        raise InvalidArgumentError(
            f"a time zone applies to a day, week, month or year; {what} are counted in UTC"
            f" (from the Unix epoch), so time zone {zone!r} would change nothing, or"
            " repeat an hour where clocks go back: for a day that starts at midnight in"
            f" {zone}, use the period 'day' (or daily)"
        )
    return Period(period.unit, None, name)


def check_period(period: object, timezone: object = None) -> str:
    """The one spelling (:attr:`Period.text`) of ``period``, in ``timezone`` (an IANA
    name; None: UTC) if given; :class:`~pgsolo.InvalidArgumentError` otherwise."""
    read = read_period(period)
    return (read if timezone is None else _in_zone(read, timezone)).text
