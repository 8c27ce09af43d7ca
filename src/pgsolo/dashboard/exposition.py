"""``/metrics``: the database's advisory locks as Prometheus reads them, by state
(granted or waiting) and by age, read from ``pg_locks`` at each scrape.

postgres_exporter counts ``pg_locks`` by mode only (its collector has no locktype
label), so advisory locks are lost among the rest: these are theirs alone. The text
format is written here rather than through ``prometheus_client``: the numbers are a
snapshot read per scrape, not counters a process keeps, and :mod:`pgsolo.metrics` is the
one module that imports that library (it counts the application's own locks and jobs).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..monitor import AdvisoryLock

__all__ = ["AGE_BUCKETS", "CONTENT_TYPE", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: from a lock taken for one statement to one forgotten for a day.
AGE_BUCKETS = (1.0, 10.0, 60.0, 300.0, 3600.0, 86400.0)

_STATES = ("granted", "waiting")


def exposition(locks: Sequence[AdvisoryLock]) -> str:
    """The text exposition of ``locks`` (:func:`~pgsolo.advisory_locks`' rows)."""
    by_state: dict[str, list[AdvisoryLock]] = {state: [] for state in _STATES}
    for lock in locks:
        by_state["granted" if lock.granted else "waiting"].append(lock)
    lines = [
        "# HELP pgsolo_advisory_locks Advisory locks of this database, held (granted) or"
        " waited for.",
        "# TYPE pgsolo_advisory_locks gauge",
        *(f'pgsolo_advisory_locks{{state="{s}"}} {len(by_state[s])}' for s in _STATES),
        "# HELP pgsolo_advisory_locks_by_age Advisory locks held or waited for at most le"
        " seconds (cumulative; an age the server does not give counts in +Inf only).",
        "# TYPE pgsolo_advisory_locks_by_age gauge",
    ]
    for state in _STATES:
        ages = [lock.age_seconds for lock in by_state[state]]
        for bound in AGE_BUCKETS:
            count = sum(1 for age in ages if age is not None and age <= bound)
            lines.append(f'pgsolo_advisory_locks_by_age{{state="{state}",le="{bound:g}"}} {count}')
        lines.append(f'pgsolo_advisory_locks_by_age{{state="{state}",le="+Inf"}} {len(ages)}')
    lines += [
        "# HELP pgsolo_advisory_lock_oldest_seconds The oldest advisory lock held or waited"
        " for, in seconds (0 when there is none).",
        "# TYPE pgsolo_advisory_lock_oldest_seconds gauge",
    ]
    for state in _STATES:
        oldest = max((lock.age_seconds or 0.0 for lock in by_state[state]), default=0.0)
        lines.append(f'pgsolo_advisory_lock_oldest_seconds{{state="{state}"}} {oldest:.3f}')
    return "\n".join(lines) + "\n"
