"""Bench settings: the project's own, pointed at a bench database and a fixed secret.

Middleware, connection persistence and everything else stay the project's, so the
three endpoints run under exactly the set-up a deployment would have.
"""

from __future__ import annotations

import environ

from project.settings import *  # noqa: F403
from project.settings import DATABASES as _PROJECT_DATABASES
from project.settings import WEBHOOK_RECEIVER as _PROJECT_WEBHOOK_RECEIVER
from tests.bench.common import DEFAULT_DATABASE_URL, SHOP_SECRET, SOURCE, TOLERANCE_SECONDS

DEBUG = False
ROOT_URLCONF = "tests.bench.urls"

DATABASES = {
    "default": environ.Env().db("BENCH_DATABASE_URL", default=DEFAULT_DATABASE_URL),
}
for _key in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS"):
    DATABASES["default"][_key] = _PROJECT_DATABASES["default"][_key]

WEBHOOK_RECEIVER = {
    **_PROJECT_WEBHOOK_RECEIVER,
    "SOURCES": {
        SOURCE: {
            "SCHEME": "standard",
            "SECRETS": [SHOP_SECRET],
            "TOLERANCE_SECONDS": TOLERANCE_SECONDS,
        },
    },
}

# Warnings and errors only: per-request INFO lines would cost time and drown failures.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
