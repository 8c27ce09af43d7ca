"""Recording an attempt in the ledger over its own connection, or over a spare one when
that one is gone (the attempt's connection died with its lock)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...drivers import AsyncDriver, adapt_async
from ...drivers._async.connect import aopen_connection
from ...drivers.conninfo import DEFAULT_ANSWER_TIMEOUT
from ...locking import adrive
from ..definition import Job, JobResult
from ..record import Warn, log_unrecorded, log_warning, record_plan

__all__ = ["arecord_result"]


async def arecord_result(
    job: Job,
    result: JobResult[Any],
    driver: AsyncDriver,
    dsn: str | None,
    *,
    exit_code: int | None = None,
    warn: Warn = log_warning,
    defaults: Mapping[str, str] | None = None,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
) -> None:
    """Record ``result`` over the attempt's own connection (``driver``) or, when that one
    is gone, over a new one to ``dsn`` (opened with ``defaults`` and ``answer_timeout``,
    as :func:`~pgsolo.drivers._async.connect.aopen_connection` takes them); with no ``dsn``, log
    that it is not recorded. A connection that dies under the write is gone as well: the
    row goes over a spare one, and the attempt's result stands (a row the server committed
    just before the end is then written twice). Other errors are raised."""
    if not driver.is_closed():
        try:
            await adrive(record_plan(job, result, driver, exit_code=exit_code, warn=warn), driver)
        except Exception:
            if not driver.is_closed():
                raise
        else:
            return
    if dsn is None:
        log_unrecorded(job, result)
        return
    name = job.application_name_for(dsn)
    async with aopen_connection(
        dsn, application_name=name, defaults=defaults, answer_timeout=answer_timeout
    ) as spare:
        spare_driver = adapt_async(spare)
        await adrive(
            record_plan(job, result, spare_driver, exit_code=exit_code, warn=warn), spare_driver
        )
