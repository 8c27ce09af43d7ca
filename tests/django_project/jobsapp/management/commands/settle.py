"""A job that uses pgsolo's tables through Django's connection: recorded in the ledger
(``record=True``, key ``django:jobsapp:settle``), it settles the operation ``--op`` once
(``run_once``) and prints what that found, ``<outcome> <attempts> <result>``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

import pgsolo
from pgsolo.django import singleton_command


class Command(BaseCommand):
    help = "Settle an operation once, as a job of the ledger."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--op", required=True)

    @singleton_command(record=True)
    def handle(self, *args: Any, op: str, **options: Any) -> str:
        done = pgsolo.run_once(connection, op, lambda ctx: {"settled": ctx.op_key})
        return f"{done.outcome} {done.attempts} {done.result['settled']}"
