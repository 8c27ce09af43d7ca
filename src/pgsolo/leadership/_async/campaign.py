"""``campaign_async``: stand for leadership for as long as a service runs, lead each time
it wins, and stand again after a term ends, with back-off when the database is away."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ..._acompat import AIS_ASYNC, AStop, apause
from ..._logging import leaders_logger, log_event
from ...drivers._async.connect import aopen_connection
from ...drivers.conninfo import application_name_for
from ...errors import (
    DatabaseUnavailableError,
    InvalidArgumentError,
    LockLostError,
    LockTimeoutError,
)
from ...keys import LEADER_PREFIX
from ...locking import Keep, as_keep, keepalive_basis
from ..candidacy import CAMPAIGN_LOOK_EVERY, check_campaign
from .leader import AsyncTerm, own_term

__all__ = ["campaign_async"]

# After a term or a failure, the next try waits a random moment of up to this much, then
# twice as much after each failure in a row, up to _BACKOFF_MAX: replicas that lost the
# database together do not all come back at once.
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0
_JITTER = random.SystemRandom()  # not seeded alike in processes forked from one


async def campaign_async(
    dsn: str,
    name: str,
    lead: Callable[[AsyncTerm], Awaitable[Any]],
    *,
    stop: AStop | None = None,
    keep: bool | Keep = True,
    fencing: bool = True,
) -> None:
    """Stand for the leadership of ``name`` until ``stop`` is set: each time this replica
    leads, ``await lead(term)`` runs for the term; when the term ends (``lead`` returned,
    or the term was lost: its :class:`~pgsolo.LockLostError`) or the database cannot be
    reached, it stands again after a short, random and growing pause. What else ``lead``
    raises ends the campaign with it, and so does any other error of pgsolo's (a
    :class:`~pgsolo.NotMigratedError`: ``fencing`` needs ``pgsolo migrate``).

    The candidate keeps one connection, opened from ``dsn`` and named
    ``pgsolo:leader:<name>``, from one term to the next, and waits on it in bounded slices
    that hold back no VACUUM; it looks at ``stop`` between two of them (every second).
    ``keep`` and ``fencing`` are :func:`leader_async`'s; a stopped leader's ``lead`` is not
    stopped for it: end it when ``stop`` is set (or cancel the campaign's task, whose
    cancellation ends a term and its wait the way it ends any lock's). Everything is
    validated before anything connects.
    """
    check_campaign(dsn, name, lead, keep=keep, fencing=fencing, cancel=AIS_ASYNC)
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise InvalidArgumentError(f"stop must be an event (is_set()), got {stop!r}")
    named = application_name_for(dsn, LEADER_PREFIX + name)
    failures = 0
    while not (stop is not None and stop.is_set()):
        try:
            async with aopen_connection(
                dsn, application_name=named, check_timeout=keepalive_basis(as_keep(keep))
            ) as conn:
                failures = 0
                while not (stop is not None and stop.is_set()):
                    term: AsyncTerm | None = None
                    try:
                        async with own_term(
                            conn, name, wait=CAMPAIGN_LOOK_EVERY, keep=keep, fencing=fencing
                        ) as term:
                            if stop is not None and stop.is_set():
                                break  # won as it was stopped: the term ends unled
                            _said("leading", term, logging.INFO)
                            await lead(term)
                    except LockTimeoutError:
                        continue  # nobody let go meanwhile: look at stop, and wait again
                    except LockLostError as lost:
                        _said("lost", term or name, logging.INFO, reason=lost.reason)
                        break  # the connection went with the term: a new one
                    _said("ended", term or name, logging.INFO)
                    if await apause(_pause(0), stop):
                        return _said("stopped", name, logging.INFO)
        except (DatabaseUnavailableError, LockLostError) as failed:
            failures += 1
            retry = _pause(failures)
            _said_unavailable(name, failed, retry)
            if await apause(retry, stop):
                return _said("stopped", name, logging.INFO)
        else:
            if await apause(_pause(failures), stop):
                return _said("stopped", name, logging.INFO)
    _said("stopped", name, logging.INFO)


def _said(what: str, about: AsyncTerm | str, level: int, *, reason: str | None = None) -> None:
    """One line on ``pgsolo.leaders``: a term began, ended or was lost (the lock has said
    the loss at WARNING already: one loss, one warning), or the campaign stopped."""
    term = about if isinstance(about, AsyncTerm) else None
    fields = {
        "name": term.name if term is not None else about,
        "token": term.token if term is not None else None,
        "backend_pid": term.backend_pid if term is not None else None,
        "reason": reason,
    }
    log_event(leaders_logger, level, "leader", "event", what, fields)


def _said_unavailable(name: str, failed: BaseException, retry: float) -> None:
    log_event(
        leaders_logger,
        logging.WARNING,
        "leader",
        "event",
        "unavailable",
        {"name": name, "error": str(failed).strip(), "retry_in_s": round(retry, 3)},
    )


def _pause(failures: int) -> float:
    """A random moment of up to the back-off after ``failures`` failures in a row."""
    return _JITTER.uniform(0.0, min(_BACKOFF_MAX, _BACKOFF_FIRST * 2**failures))
