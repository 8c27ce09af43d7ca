"""The test project's settings: its database ``default`` is the test server's
(``PGSOLO_TEST_DSN``, which the tests set to their own database), ``lite`` a SQLite one
(``PGSOLO_TEST_SQLITE``, a file of the test's). pgsolo's app is installed, its
``PGSOLO_GRANT_TO`` read from ``PGSOLO_TEST_GRANT_TO`` (roles, comma-separated), and the
router keeps pgsolo's tables out of the aliases of ``PGSOLO_TEST_NO_PGSOLO_IN``."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["PGSOLO_TEST_DSN"])

SECRET_KEY = "pgsolo-tests-only"  # noqa: S105 - a test project, never served
USE_TZ = True
INSTALLED_APPS = ["jobsapp", "pgsolo.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(_db.get("dbname", "postgres")),
        "USER": str(_db.get("user", "")),
        "PASSWORD": str(_db.get("password", "")),
        "HOST": str(_db.get("host", "")),
        "PORT": str(_db.get("port", "")),
    },
    "lite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("PGSOLO_TEST_SQLITE", ":memory:"),
    },
}
DATABASE_ROUTERS = ["project.routers.PgsoloRouter"]
if "PGSOLO_TEST_GRANT_TO" in os.environ:
    PGSOLO_GRANT_TO = os.environ["PGSOLO_TEST_GRANT_TO"].split(",")
