"""Bench settings: the project's own, pointed at a bench database and a fixed secret.

Middleware, connection persistence and everything else stay the project's, so the
three endpoints run under exactly the set-up a deployment would have.
"""

from __future__ import annotations

import os

from tests.bench.common import DEFAULT_DATABASE_URL, SHOP_SECRET, SOURCE, TOLERANCE_SECONDS

# The project's settings read DATABASE_URL themselves: point it at the bench database
# first, so connection persistence, health checks and driver options are the project's.
# (or, with --pgbouncer, at the pooler in front of it)
os.environ["DATABASE_URL"] = os.environ.get("BENCH_SERVE_DATABASE_URL") or os.environ.get(
    "BENCH_DATABASE_URL", DEFAULT_DATABASE_URL
)

from project.settings import *  # noqa: E402, F403
from project.settings import WEBHOOK_RECEIVER as _PROJECT_WEBHOOK_RECEIVER  # noqa: E402

DEBUG = False
ROOT_URLCONF = "tests.bench.urls"

WEBHOOK_RECEIVER = {
    **_PROJECT_WEBHOOK_RECEIVER,
    # its merchants listen on loopback
    "EGRESS_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    # the relay's bench signs with destination secrets, encrypted at rest like anywhere
    "SECRET_ENCRYPTION_KEYS": ["mZ1g2dDqXmNaeqvnkZ3fh_J4ivXq9RZJPRnNvFyAFqs="],
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
