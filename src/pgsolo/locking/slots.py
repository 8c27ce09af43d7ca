"""Which slot of a limit to take next, and how long to wait for it: the one schedule of
:func:`~pgsolo.semaphore` and of a job with ``limit=``.

A holder of a limit of N holds one of N keys (DESIGN §2, Semaphore keys). PostgreSQL can
queue a waiter on one key only, and the slot that frees first may be any of them: so a
waiter tries every slot, then waits on one slot for a short turn (the server wakes it the
moment that one frees), then tries every slot again, and so on, taking whichever frees
first within a turn.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

__all__ = ["TURN_SECONDS", "slot_attempts"]

TURN_SECONDS = 0.25
"""A waiter waits on one slot for this long at most, then tries every slot again: the
longest a slot that frees stays free while someone waits for one. Each turn is one
statement, so no waiter holds a snapshot longer than this either."""


def slot_attempts(limit: int, wait: float | None) -> Iterator[tuple[int, float | None]]:
    """The attempts of one acquisition, each ``(slot, seconds to wait for it)`` (None: a
    try): every slot once, in an order of its own (candidates spread over the slots,
    not all on slot 0); then, while ``wait`` seconds last, a turn on one slot and every
    slot again, each try too only while they last. The caller stops at the first slot it
    gets; when the attempts run out, no slot was free (``wait`` None) or none freed in
    time."""
    order = random.sample(range(limit), limit)  # a spread over the slots, not a secret
    if wait is None:
        yield from ((slot, None) for slot in order)
        return
    # From the start, and for every try: a sweep of many slots over a slow link takes
    # seconds of its own, and a wait must end when its seconds are over.
    deadline = time.monotonic() + wait
    turn = 0
    while True:
        for slot in order:
            if time.monotonic() >= deadline:
                return
            yield slot, None
        if (left := deadline - time.monotonic()) <= 0:
            return
        yield order[turn % limit], min(TURN_SECONDS, left)
        turn += 1
