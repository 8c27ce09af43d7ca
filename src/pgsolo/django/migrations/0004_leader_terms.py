"""pgsolo's schema version 4, by pgsolo's own migration
``pgsolo/schema/migrations/0004_leader_terms.sql``."""

from __future__ import annotations

from django.db import migrations

from ..schema import to_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = (("pgsolo", "0003_operations"),)
    operations = (to_version(4),)
