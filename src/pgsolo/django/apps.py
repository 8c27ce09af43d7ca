"""The Django app ``pgsolo.django`` (label ``pgsolo``): in ``INSTALLED_APPS``, its
migrations put pgsolo's tables in each database ``manage.py migrate`` migrates
(:mod:`pgsolo.django.schema`), and ``manage.py pgsolo_grant`` is one of its commands."""

from __future__ import annotations

from django.apps import AppConfig


class PgsoloConfig(AppConfig):  # type: ignore[misc]
    name = "pgsolo.django"
    label = "pgsolo"  # the last part of the name, "django", would read as Django's own
    verbose_name = "pgsolo"
