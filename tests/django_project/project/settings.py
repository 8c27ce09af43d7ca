"""The test project's settings: its database ``default`` is the test server's
(``PGSOLO_TEST_DSN``, which the tests set to their own database), ``lite`` a SQLite one
(``PGSOLO_TEST_SQLITE``, a file of the test's). pgsolo's app is installed, its
``PGSOLO_GRANT_TO`` read from ``PGSOLO_TEST_GRANT_TO`` (roles, comma-separated), and the
router keeps pgsolo's tables out of the aliases of ``PGSOLO_TEST_NO_PGSOLO_IN``.

With ``PGSOLO_TEST_SITE=1`` it is also a site to serve (``manage.py runserver``): the
admin and what it needs (auth, sessions, messages), its URLs and the dashboard's
include (``project/urls.py``), ``default``'s connections kept between requests and
named ``pgsolo-test-site``; with ``PGSOLO_TEST_ATOMIC_REQUESTS=1`` each request is a
transaction, and the name ``pgsolo-test-site-atomic``. The dashboard names the key of
``settings-named-key`` (``PGSOLO_DASHBOARD_NAMES``). Without it, ``manage.py migrate``
migrates pgsolo's app alone."""

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

if os.environ.get("PGSOLO_TEST_SITE") == "1":
    INSTALLED_APPS += [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    ROOT_URLCONF = "project.urls"
    PGSOLO_DASHBOARD_NAMES = ["settings-named-key"]  # as pgsolo locks --name
    ALLOWED_HOSTS = ["127.0.0.1"]
    DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
    _atomic = os.environ.get("PGSOLO_TEST_ATOMIC_REQUESTS") == "1"
    DATABASES["default"].update(
        # One connection kept between requests (runserver --nothreading serves them all
        # on one thread): the tests find it by its name, and look at what it holds.
        CONN_MAX_AGE=None,
        OPTIONS={"application_name": "pgsolo-test-site-atomic" if _atomic else "pgsolo-test-site"},
        ATOMIC_REQUESTS=_atomic,
    )
