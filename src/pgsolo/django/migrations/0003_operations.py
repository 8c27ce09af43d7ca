"""pgsolo's schema version 3, by pgsolo's own migration
``pgsolo/schema/migrations/0003_operations.sql``."""

from __future__ import annotations

from django.db import migrations

from ..schema import to_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = (("pgsolo", "0002_fencing_tokens"),)
    operations = (to_version(3),)
