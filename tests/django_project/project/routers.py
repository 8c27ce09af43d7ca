"""A database router as a project with several databases writes one: pgsolo's tables
(app label ``pgsolo``) are not migrated into the aliases of ``PGSOLO_TEST_NO_PGSOLO_IN``
(comma-separated); every other question is left to Django."""

from __future__ import annotations

import os
from typing import Any


class PgsoloRouter:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == "pgsolo":
            return db not in os.environ.get("PGSOLO_TEST_NO_PGSOLO_IN", "").split(",")
        return None
