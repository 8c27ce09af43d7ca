"""What a candidate for leadership asks for, validated before anything connects: the
leader name, the key it stands for, and how the term is watched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ..drivers import DriverBase, Lacking
from ..errors import InvalidArgumentError, LockLostError, UsageError
from ..keys import Key, leader_key, text_of
from ..locking import MAX_WAIT_SECONDS, Keep, as_keep, wait_ms_of

__all__ = ["CAMPAIGN_LOOK_EVERY", "Candidacy", "check_campaign"]

# A campaign's candidate waits this long at a time, then looks at its ``stop``: the longest
# a stop waits for a candidate, on the one connection it keeps for its whole candidacy.
CAMPAIGN_LOOK_EVERY = 1.0


@dataclass(frozen=True)
class Candidacy:
    """A validated call of ``leader()``: the name and its key, the wait, and the keeper
    (None: unwatched) whose ``on_lost`` also ends the term's wait (``lost``)."""

    name: str
    key: Key
    wait: float
    fencing: bool
    keep: Keep | None

    @classmethod
    def define(
        cls,
        name: object,
        *,
        wait: float,
        keep: bool | Keep,
        fencing: bool,
        cancel: bool,
        lost: Callable[[LockLostError], object] | None = None,
    ) -> Candidacy:
        """``cancel``: what ``keep=True`` does to the leader's task (async only); ``lost``:
        called with the loss before the caller's own ``on_lost``."""
        key = leader_key(name)
        if wait is None:
            raise InvalidArgumentError(
                "a candidate waits to lead: wait= takes seconds, or math.inf (the default) to"
                " wait for as long as it takes; to ask once whether a key is free, use"
                " session_lock()"
            )
        try:
            wait_ms_of(wait)  # the same range as a lock's wait
        except InvalidArgumentError:
            # Not a lock's advice to try once with wait=None, which a candidate refuses.
            raise InvalidArgumentError(
                f"wait must be a number of seconds above 0 and at most {MAX_WAIT_SECONDS:g}"
                f", or math.inf (the default) to wait for as long as it takes; got {wait!r}"
            ) from None
        if not isinstance(fencing, bool):
            raise InvalidArgumentError(f"fencing must be True or False, got {fencing!r}")
        if keep is True:
            keep = Keep(cancel=cancel)
        watched = as_keep(keep)
        if watched is not None and lost is not None:
            watched = dataclasses.replace(watched, on_lost=_both(lost, watched.on_lost))
        return cls(text_of(cast(str, name)), key, float(wait), fencing, watched)

    def refuse_unwatchable(self, driver: DriverBase) -> None:
        """A watched term on a connection no keeper can share (asyncpg's, pg8000's):
        refused before any SQL, with the two ways out."""
        found = driver.heartbeat()
        if self.keep is not None and isinstance(found, Lacking):
            raise UsageError(
                "leader() watches its term with a keeper, which cannot share this"
                f" connection: {found.why} Pass a connection string instead (pgsolo opens a"
                " connection of its own and watches it), or keep=False to lead unwatched"
                " (a loss is then found only when the term ends)."
            )


def _both(
    first: Callable[[LockLostError], object], then: Callable[[LockLostError], object] | None
) -> Callable[[LockLostError], object]:
    if then is None:
        return first

    def on_lost(error: LockLostError) -> None:
        first(error)
        then(error)

    return on_lost


def check_campaign(
    dsn: object, name: object, lead: object, *, keep: bool | Keep, fencing: bool, cancel: bool
) -> None:
    """What a campaign is given (``campaign()``, ``lead_in_background()``), checked before
    anything connects or starts: a connection string to open its own connection from,
    ``lead`` callable, and the candidacy of ``name``."""
    if not isinstance(dsn, str):
        raise InvalidArgumentError(
            "a campaign opens a connection of its own and keeps it from one term to the"
            f" next: it takes a connection string, got {type(dsn).__name__}"
        )
    if not callable(lead):
        raise InvalidArgumentError(f"lead must be callable with the term, got {lead!r}")
    Candidacy.define(name, wait=CAMPAIGN_LOOK_EVERY, keep=keep, fencing=fencing, cancel=cancel)
