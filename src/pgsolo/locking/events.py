"""What happens to one lock, told once: the log line of each event and the metrics'
count of each acquisition's outcome and of each loss."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from .. import metrics
from .._logging import locks_logger as logger
from .._logging import log_event
from ..drivers import DriverBase
from ..errors import LockLostError
from ..keys import Key
from .spec import LockSpec

__all__ = ["LockEvents", "let_go_for_its_holder"]

# Events of the log that end an acquisition, as the metrics' outcomes name them.
_OUTCOMES = {"reentered": "acquired", "refused": "error"}


class LockEvents:
    """The log and the metrics of one lock (``spec``) on one connection (``driver``): a
    base of every :class:`~pgsolo.locking.core.LockCore`, which sets both. A lock is its
    own events, not a second object beside it: every lock is built for one acquisition,
    and a lock's own Python costs several times as much in place, between round trips,
    as timed alone, for each object and function it touches (docs/benchmarks.md).

    It owns the two flags that make each count happen once: an acquisition's outcome is
    counted by whichever event ends it first, and a loss is logged by the keeper that sees
    it and again by the release that confirms it. Nothing is counted before an
    acquisition begins (:meth:`~pgsolo.locking.core.LockCore.begin` says so, and gets the
    metrics ready): until then the flags are the class's, and building a lock sets
    neither."""

    spec: LockSpec
    driver: DriverBase
    _outcome_counted = True
    _loss_counted = True

    def count_anew(self) -> None:
        """Count as a lock that never began an acquisition (a job's next slot)."""
        self._outcome_counted = True
        self._loss_counted = True

    def log(
        self,
        level: int,
        event: str,
        started: float | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """Log an event of this lock (``started``: when what it ends began; ``extra``: its
        own fields), and count it in the metrics: the acquisition's outcome, by the first
        event that ends it (counted here without a call, as every lock's is), or a loss,
        once. The fields are a mapping, not keywords: a function that takes ``**`` is
        called the slow way, with a dict made for every call, and every lock logs."""
        if (
            not self._outcome_counted
            and (outcome := _OUTCOMES.get(event, event)) in metrics.LOCK_OUTCOMES
        ):
            self._outcome_counted = True
            self._loss_counted = outcome != "acquired"  # only a held lock can be lost
            wait = 0.0 if started is None else time.perf_counter() - started
            metrics.observe_lock(self.spec.key.name, self.spec.lifetime, outcome, wait)
        elif event == "lost" and not self._loss_counted:
            self._loss_counted = True
            reason = str(extra.get("reason") or "") if extra is not None else ""
            metrics.observe_lock_lost(self.spec.key.name, self.spec.lifetime, reason)
        if not logger.isEnabledFor(level):
            return
        spec = self.spec
        info = self.driver.server_info()
        fields: dict[str, object] = {
            "key": spec.key.text,
            "name": spec.key.name,
            "lifetime": spec.lifetime,
            "mode": "wait" if spec.wait_ms is not None else "try",
            "shared": spec.shared,
            "database": info.database,
            "server": info.address,
            "application_name": info.application_name,
            "backend_pid": self.driver.backend_pid(),
        }
        if started is not None:
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if extra is not None:
            fields.update(extra)
        log_event(logger, level, "advisory lock", "event", event, fields)

    def log_lost(self, error: LockLostError) -> None:
        self.log(logging.WARNING, "lost", None, {"reason": error.reason, "error": str(error)})


def let_go_for_its_holder(key: Key, lifetime: str, event: str) -> dict[str, object]:
    """The ``extra`` of the warning that a lock still held was let go for its holder
    (``event``: ``released-at-check-in`` by a pool's reset, ``released-at-request-end`` by
    Django's): its fields in ``record.pgsolo``, as every lock event has them."""
    return {"pgsolo": {"event": event, "key": key.text, "name": key.name, "lifetime": lifetime}}
