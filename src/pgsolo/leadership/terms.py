"""When a term began, recorded on the server (``pgsolo.leader_terms``) for ``pgsolo
doctor`` and ``pgsolo locks``: PostgreSQL keeps no time at which a lock was granted, and a
candidate's session may be days older than its term."""

from __future__ import annotations

import threading

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import DriverBase
from ..locking.plans import Plan

__all__ = ["record_term_plan"]

# A database that refuses the record refuses every term's: said once per process.
_TOLD = threading.Event()


def record_term_plan(driver: DriverBase, name: str, token: int | None) -> Plan[None]:
    """Record that the term of ``name`` begins now, on the session that holds its key:
    one autocommit statement, right after the lock is won, only on a connection pgsolo
    opened itself (a caller's goes back exactly as it was found). It does nothing where
    the table is missing or the role may not write it, and a failure never ends the term:
    it is logged, and the monitor shows the session's age instead."""
    try:
        yield [sql.record_term(name, token)]
    except Exception as exc:
        log = logger.debug if _TOLD.is_set() else logger.warning
        _TOLD.set()
        log(
            "pgsolo: leader %r leads, but when its term began could not be recorded"
            " (pgsolo doctor and pgsolo locks show its session's age instead): %s",
            name,
            driver.scrub(str(exc).strip()),
        )
