"""pgsolo's schema version 1, by pgsolo's own migration
``pgsolo/schema/migrations/0001_ledger.sql``."""

from __future__ import annotations

from django.db import migrations

from ..schema import to_version


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    operations = (to_version(1),)
