"""pgsolo's schema version 2, by pgsolo's own migration
``pgsolo/schema/migrations/0002_fencing_tokens.sql``."""

from __future__ import annotations

from django.db import migrations

from ..schema import to_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = (("pgsolo", "0001_ledger"),)
    operations = (to_version(2),)
