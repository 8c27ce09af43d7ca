"""``manage.py`` of the Django project the tests run management commands of, as a deployment
would: ``python manage.py nightly ...``, its settings read from the environment."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
