"""What one lock is, fixed before any SQL: :class:`LockSpec` (its key, lifetime, wait,
mode, fencing) and :class:`Keep` (how a held session lock is watched), with the checks
that turn a caller's arguments into them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .._types import DAY, MAX_WAIT_SECONDS, Lifetime, check_seconds
from ..drivers import DriverBase, heartbeat_of
from ..drivers.conninfo import KEEPALIVE_BASIS, keepalive_basis_outlasting
from ..errors import InvalidArgumentError, LockLostError, UsageError
from ..keys import Key, KeyLike, key_of

__all__ = [
    "MAX_WAIT_SECONDS",
    "Keep",
    "LockSpec",
    "as_keep",
    "check_flags",
    "keepalive_basis",
    "refuse_keeper",
    "try_spec",
    "wait_ms_of",
]

MIN_INTERVAL = 0.01
MAX_INTERVAL = DAY  # for interval and timeout alike: a longer one watches nothing


@dataclass(frozen=True, slots=True)
class Keep:
    """How a session lock is watched (``session_lock(..., keep=Keep(...))``;
    ``keep=True`` is ``Keep()``).

    ``interval``: seconds between beats. ``timeout``: seconds the server has to answer a
    beat before the connection is shut down and the lock counted as lost. Both are from
    0.01 to 86400 (one day); anything else raises :class:`~pgsolo.InvalidArgumentError`
    here, before any lock is taken. ``on_lost``:
    called with the :class:`~pgsolo.LockLostError` once, from the keeper's thread (sync)
    or task (async); what it raises is logged. ``cancel``: for an async lock, cancel the
    task that took the lock.
    """

    interval: float = 1.0
    timeout: float = 10.0
    on_lost: Callable[[LockLostError], object] | None = None
    cancel: bool = False

    def __post_init__(self) -> None:
        for label, value in (("interval", self.interval), ("timeout", self.timeout)):
            check_seconds(f"Keep {label}", value, MIN_INTERVAL, MAX_INTERVAL)
        if self.on_lost is not None and not callable(self.on_lost):
            raise InvalidArgumentError(f"on_lost must be callable, got {self.on_lost!r}")
        if not isinstance(self.cancel, bool):
            raise InvalidArgumentError(f"cancel must be True or False, got {self.cancel!r}")


def keepalive_basis(keep: Keep | None, *, stopping: float = 0.0) -> float:
    """The ``check_timeout`` of a connection pgsolo opens to hold a lock that ``keep``
    watches: its server keepalives give a silent client up only after the keeper gave
    the lock up, at most ``interval`` + ``timeout`` after the last beat the server heard
    (a beat's wait, then its timeout), and after the ``stopping`` seconds the work may
    take to stop then (``pgsolo run --grace``: SIGTERM, then SIGKILL). Unwatched:
    KEEPALIVE_BASIS."""
    if keep is None:
        return KEEPALIVE_BASIS
    return keepalive_basis_outlasting(keep.interval + keep.timeout + stopping)


def as_keep(keep: bool | Keep | None) -> Keep | None:
    if keep is None or keep is False:
        return None
    if keep is True:
        return Keep()
    if isinstance(keep, Keep):
        return keep
    raise InvalidArgumentError(f"keep must be True, False or a pgsolo.Keep, got {keep!r}")


def check_flags(*, shared: bool, reentrant: bool, fencing: bool) -> None:
    """Flags other than all False. The common case is left out by the caller, without a
    call: every lock is made with its flags checked."""
    for flag, label in ((shared, "shared"), (reentrant, "reentrant"), (fencing, "fencing")):
        if not isinstance(flag, bool):
            raise UsageError(f"{label} must be True or False, got {flag!r}")
    if fencing and (shared or reentrant):
        several = "a shared lock" if shared else "a re-entrant lock"
        raise UsageError(
            f"fencing tokens order exclusive holders one after another; {several} has"
            " several holders at once"
        )


def refuse_keeper(driver: DriverBase) -> None:
    """Refuse ``keep=`` before any SQL on a driver whose connection a heartbeat cannot share
    with the caller's statements (:class:`~pgsolo.drivers.Lacking` says why): the same
    :class:`~pgsolo.UsageError` on every driver."""
    heartbeat_of(driver.heartbeat())


def wait_ms_of(wait: float | None) -> float | None:
    """``wait`` in whole milliseconds (rounded up), ``math.inf`` for a wait with no end
    (``wait=math.inf``), or None for a try."""
    if wait is None:
        return None
    # The common case without check_seconds' calls: a number of seconds in range (a bool
    # is neither type, and NaN fails both comparisons).
    if (type(wait) is float or type(wait) is int) and 0 < wait <= MAX_WAIT_SECONDS:
        return max(1, math.ceil(wait * 1000))
    if isinstance(wait, float) and wait == math.inf:
        return math.inf
    try:
        seconds = check_seconds("wait", wait, 0, MAX_WAIT_SECONDS, above_low=True)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{exc} (or math.inf, to wait for as long as it takes); use wait=None to try"
            " once without waiting"
        ) from None
    return max(1, math.ceil(seconds * 1000))


class LockSpec(NamedTuple):
    """One lock as asked for; nothing in it changes while the lock is taken and given
    back. ``wait_ms``: None for a try (see :func:`wait_ms_of`). ``verify_commit`` (a
    transaction lock of a job): pgsolo's own transaction commits only if it is still the
    one that took the lock. ``keep``: the keeper a held session lock gets.

    A named tuple, not a frozen dataclass: every lock makes one, and a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, which costs twice the
    tuple's whole construction."""

    key: Key
    lifetime: Lifetime
    wait_ms: float | None
    shared: bool = False
    reentrant: bool = False
    fencing: bool = False
    keep: Keep | None = None
    verify_commit: bool = False

    @property
    def wait_seconds(self) -> float:
        return (self.wait_ms or 0) / 1000


# The spec of a plain try (no wait, no flags, no keeper, a key given as it is: no namespace
# or registry) of each lifetime and key, made once per key: most locks are one, and
# resolving a key and making a named tuple cost a third of building a lock. By the id of
# the key as the caller gave it (the same int, pair or name object, as a constant is),
# kept beside the spec: while it is here, no other object can have its id. Emptied when
# full, as a process that locks ever new keys must not keep them all.
_TRIES: dict[Lifetime, dict[int, tuple[KeyLike, LockSpec]]] = {"xact": {}, "session": {}}
_TRIES_MAX = 4096


def try_spec(key: KeyLike, lifetime: Lifetime) -> LockSpec:
    """The spec of a plain try of ``key`` (resolved with no namespace or registry) for
    ``lifetime``; an invalid key raises, and nothing is kept of it."""
    tries = _TRIES[lifetime]
    entry = tries.get(id(key))
    if entry is not None and entry[0] is key:
        return entry[1]
    spec = LockSpec(key_of(key, None, None), lifetime, None)
    if len(tries) >= _TRIES_MAX:
        tries.clear()
    tries[id(key)] = (key, spec)
    return spec
