"""pgsolo's schema version 5, by pgsolo's own migration
``pgsolo/schema/migrations/0005_retention.sql``."""

from __future__ import annotations

from django.db import migrations

from ..schema import to_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = (("pgsolo", "0004_leader_terms"),)
    operations = (to_version(5),)
