"""``lead_in_background``: an asyncio application (an ASGI app's lifespan, a worker's main)
stands for leadership in a task of its own for as long as it runs, and its work runs only
while this replica leads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from .._logging import leaders_logger, log_event
from ..locking import Keep
from ._async.campaign import campaign_async
from ._async.leader import AsyncTerm
from .candidacy import check_campaign

__all__ = ["Standing", "lead_in_background"]


class Standing:
    """A replica's candidacy for the leader ``name``, as :func:`lead_in_background` runs it:
    whether it leads now (for a health or readiness endpoint), and the term it leads in."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: The term this replica leads in now; None while it is a candidate.
        self.term: AsyncTerm | None = None

    @property
    def leading(self) -> bool:
        """Whether this replica leads now (a term held, and not lost)."""
        return self.term is not None and not self.term.lost

    def __repr__(self) -> str:
        return f"<Standing {self.name!r} {'leading' if self.leading else 'candidate'}>"


@asynccontextmanager
async def lead_in_background(
    dsn: str,
    name: str,
    lead: Callable[[AsyncTerm], Awaitable[Any]],
    *,
    keep: bool | Keep = True,
    fencing: bool = True,
) -> AsyncIterator[Standing]:
    """Stand for the leadership of ``name`` in a background task while the block runs:
    ``await lead(term)`` runs for each term this replica wins (:func:`campaign_async`, whose
    log lines on ``pgsolo.leaders`` say when it leads, loses, and stands again). With
    ``keep=True`` (the default) a lost term cancels ``lead``; the block's end (the app
    shutting down) cancels the candidacy and the term with it, so another replica leads.

    In an ASGI app's lifespan (Starlette, FastAPI, Litestar)::

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with pgsolo.lead_in_background(dsn, "scheduler", run_scheduler) as standing:
                app.state.leadership = standing  # standing.leading for a status endpoint
                yield

    What ends the candidacy before the block does (``lead`` raised, or pgsolo found
    something it cannot stand again after, such as a missing ``pgsolo migrate`` for
    ``fencing``) is logged at ERROR at once (nobody awaits the task) and raised again as
    the block ends. Everything is validated before the task starts.
    """
    check_campaign(dsn, name, lead, keep=keep, fencing=fencing, cancel=True)
    standing = Standing(name)

    async def lead_and_show(term: AsyncTerm) -> None:
        standing.term = term
        try:
            await lead(term)
        finally:
            standing.term = None

    task = asyncio.create_task(
        campaign_async(dsn, name, lead_and_show, keep=keep, fencing=fencing),
        name=f"pgsolo campaign for {name!r}",
    )
    task.add_done_callback(lambda done: _ended_early(name, done))
    try:
        yield standing
    finally:
        task.cancel()
        # asyncio.wait, not await: this task's own cancellation still reaches it.
        await asyncio.wait([task])
        log_event(leaders_logger, logging.INFO, "leader", "event", "stopped", {"name": name})
    if not task.cancelled() and (failure := task.exception()) is not None:
        raise failure


def _ended_early(name: str, task: asyncio.Task[None]) -> None:
    """The candidacy ended by itself, before the block did: nobody awaits its task, so
    say it now (the block raises it again when it ends)."""
    if task.cancelled() or (failure := task.exception()) is None:
        return
    leaders_logger.error(
        "pgsolo: the candidacy for leader %r ended: %r; this replica no longer stands",
        name,
        failure,
        exc_info=failure,
    )
