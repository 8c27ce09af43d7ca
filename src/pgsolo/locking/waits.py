"""A wait for a lock, cut into slices, so that no waiter holds back VACUUM.

A statement holds a snapshot (``backend_xmin``) for as long as it runs, and a
transaction its start (``xact_start``) for as long as it is open, even one that only waits
for a lock: one long wait would keep VACUUM from removing any row deleted or updated
since it began, in the whole database. So pgsolo waits in slices of at most
:data:`WAIT_SLICE_SECONDS`, each its own ``lock_timeout`` in its own round trip: in its own
short transaction (a session lock, or a transaction lock in pgsolo's own transaction, which
a slice that ran out rolls back and the next one opens again), or in a savepoint of the
caller's transaction, rolled back when the slice runs out. The wait as a whole is still
bounded by ``wait=`` (the last slice gets what is left of it), or by nothing with
``wait=math.inf``.

Between two slices the backend leaves PostgreSQL's queue for the key, for a few round
trips (the rollback of the slice, for a session lock the question whether it was granted
as it timed out, then the next slice): a holder that lets go in that gap hands the key to
whoever waits next, and a waiter that came later may be ahead of this one afterwards. The
queue is first come, first served within a slice only. A slice is also the longest a
waiter waits at once, so it must stay longer than the server's ``deadlock_timeout`` (1 s by
default) for PostgreSQL to find a deadlock between waits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator

__all__ = ["WAIT_SLICE_SECONDS", "Slice", "first_slice", "slices", "slices_until"]

WAIT_SLICE_SECONDS = 2.0
"""The longest a waiter waits in one statement (its oldest snapshot, give or take a round
trip); longer than PostgreSQL's default ``deadlock_timeout`` (1 s)."""

Slice = tuple[int | None, bool]
"""A slice's ``lock_timeout`` in ms (None for a try, which does not wait), and whether it
is the last slice of the wait."""


def slices(wait_ms: float | None) -> Generator[Slice, None, None]:
    """The slices of a wait of ``wait_ms`` (``math.inf``: no end; None: a try, one slice
    that does not wait), each computed when it begins, from what is left of the wait."""
    if wait_ms is None:
        yield None, True
        return
    yield from slices_until(time.monotonic() + wait_ms / 1000)


def first_slice(wait_ms: float) -> tuple[int, bool, float]:
    """The first slice of a wait of ``wait_ms``, without a generator to hold: its
    ``lock_timeout`` in ms, whether it is the last, and the wait's deadline
    (``time.monotonic()``), from which :func:`slices_until` gives the others."""
    deadline = time.monotonic() + wait_ms / 1000
    lock_timeout, last = _slice(deadline)
    return lock_timeout, last, deadline


def slices_until(deadline: float) -> Generator[tuple[int, bool], None, None]:
    """The slices of a wait that ends at ``deadline`` (``time.monotonic()``; ``math.inf``:
    no end), each computed when it begins."""
    while True:
        lock_timeout, last = _slice(deadline)
        yield lock_timeout, last
        if last:
            return


def _slice(deadline: float) -> tuple[int, bool]:
    """The slice that begins now, of a wait that ends at ``deadline``."""
    slice_ms = max(1, math.ceil(WAIT_SLICE_SECONDS * 1000))
    left_ms = (deadline - time.monotonic()) * 1000
    if left_ms <= slice_ms:
        return max(1, math.ceil(left_ms)), True
    return slice_ms, False
