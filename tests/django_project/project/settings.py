"""The test project's settings: its one database is the test server's
(``PGSOLO_TEST_DSN``, which the tests set to their own database)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["PGSOLO_TEST_DSN"])

SECRET_KEY = "pgsolo-tests-only"  # noqa: S105 - a test project, never served
USE_TZ = True
INSTALLED_APPS = ["jobsapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(_db.get("dbname", "postgres")),
        "USER": str(_db.get("user", "")),
        "PASSWORD": str(_db.get("password", "")),
        "HOST": str(_db.get("host", "")),
        "PORT": str(_db.get("port", "")),
    }
}
