"""``pgsolo run --metrics-textfile PATH / --pushgateway URL``: the run's metrics, published
when it ends (a cron job's process is gone before any scrape could reach it)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ... import metrics
from ...errors import UsageError
from ..common import without_secrets

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Publisher"]


class Publisher:
    """The run's metrics in a registry of their own (only pgsolo's: a textfile holding the
    process's own metrics would clash with node_exporter's), published at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.textfile: str | None = args.metrics_textfile
        self.gateway: str | None = args.pushgateway
        self.restore: Callable[[], None] | None = None

    def start(self) -> None:
        """Check the options and count in a fresh registry (UsageError: exit 2)."""
        if self.textfile is None and self.gateway is None:
            self.restore = metrics.count_nothing()  # nobody reads this run's counts
            return
        if self.textfile is not None:
            metrics.check_textfile(self.textfile)
        if self.gateway is not None and not self.gateway.strip():
            raise UsageError("--pushgateway needs a URL (http://host:9091)")
        self.restore = metrics.count_apart()  # UsageError without prometheus_client

    def finish(self, job: str) -> None:
        """Publish what the run counted; a failure is a warning on stderr (the run's exit
        code stays the command's), then count where the process counted before."""
        if self.restore is None:
            return
        try:
            for publish in self._targets(job):
                try:
                    publish()
                except Exception as exc:  # any failure is reported the same
                    # An error about the gateway's URL quotes it, credentials and all.
                    said = without_secrets(str(exc), [self.gateway or ""])
                    print(
                        f"pgsolo run: warning: metrics not published: {said}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            self.restore()
            self.restore = None

    def _targets(self, job: str) -> list[Callable[[], None]]:
        targets: list[Callable[[], None]] = []
        if (path := self.textfile) is not None:
            targets.append(lambda: metrics.write_textfile(path))
        if (gateway := self.gateway) is not None:
            targets.append(lambda: metrics.push(gateway, job))
        return targets
