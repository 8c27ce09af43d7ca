"""The test site's URLs (``PGSOLO_TEST_SITE=1``): the admin, the project's own login page
for users who are not staff (with the admin's template), and the dashboard's Django
include as docs/dashboard.md mounts it."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", LoginView.as_view(template_name="admin/login.html")),
    path("pgsolo/", include("pgsolo.django.dashboard")),
]
