"""A nightly job that cron starts on every host: ``@singleton_command`` lets one run do it
(its key, by default, ``django:jobsapp:nightly``).

It writes a row of the test's work table with ``--note`` through Django's connection, then
waits until the file ``--gate`` exists, so that the test decides when the run ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from pgsolo.django import singleton_command

WORK = "pgsolo_test_job_work"  # tests/_support.py's WORK


class Command(BaseCommand):
    help = "The nightly job: at most one run at a time."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--note", required=True)
        parser.add_argument("--gate", type=Path, required=True)

    @singleton_command()
    def handle(self, *args: Any, note: str, gate: Path, **options: Any) -> str:
        with connection.cursor() as cur:
            cur.execute(
                f"INSERT INTO {WORK} (job, note) VALUES ('django:jobsapp:nightly', %s)", [note]
            )
        while not gate.exists():
            time.sleep(0.05)
        return f"nightly done: {note}"
