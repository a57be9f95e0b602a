"""Test settings: the demo project's, with test sources and a real database.

DATABASE_URL picks the database (PostgreSQL by default; `make test` also runs the
suite on SQLite). pytest-django creates a test database and drops it afterwards.
"""

import os
from urllib.parse import urlsplit, urlunsplit

import environ

from project.settings import *  # noqa: F403

env = environ.Env()


def per_test_process_broker(url: str) -> str:
    """Under pytest-xdist (``make test``), each test process its own Redis database, counted
    down from the configured one (gw0 keeps it, gw1 the one below…): the Celery workers a
    test starts must not take another process's tasks. Written to the environment, with a
    mark that it is done, so that the processes a test starts keep the URL they are given."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or os.environ.get("WEBHOOK_TEST_BROKER_PER_PROCESS"):
        return url
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) - int(worker[2:])
    if database < 0:
        raise RuntimeError(f"{url}: too few Redis databases below it for test process {worker}")
    url = urlunsplit(parts._replace(path=f"/{database}"))
    os.environ["CELERY_BROKER_URL"] = os.environ["WEBHOOK_TEST_BROKER_PER_PROCESS"] = url
    return url


DATABASES = {
    "default": env.db(
        "DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/webhook_receiver"
    ),
}
# a served instance may keep its connections, as the demo does (tests/test_pgbouncer.py)
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
# PostgreSQL: the database pytest creates and drops; two runs on one server need two names
DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME", default=None)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
else:
    # as in production: server-side binding, prepared statements
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
    if DATABASE_POOL_MODE == "transaction":  # noqa: F405 (a served instance behind PgBouncer)
        for_transaction_pooling(DATABASES["default"])  # noqa: F405

SHOP_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SHOP_OLD_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
STRIPE_SECRET = "whsec_stripe_test_secret"
GITHUB_SECRET = "It's a Secret to Everybody"
# encrypts destinations' secrets at rest (tests/outbound/test_destination_secrets.py rotates it)
SECRET_ENCRYPTION_KEY = "mZ1g2dDqXmNaeqvnkZ3fh_J4ivXq9RZJPRnNvFyAFqs="

WEBHOOK_RECEIVER = {
    # the relay's, as the demo reads them from the environment (a relay a test starts)
    **{key: value for key, value in WEBHOOK_RECEIVER.items() if key.startswith("RELAY_")},  # noqa: F405
    "SOURCES": {
        # two secrets at once: a rotation in progress
        "shop": {"SCHEME": "standard", "SECRETS": [SHOP_OLD_SECRET, SHOP_SECRET]},
        "stripe": {"SCHEME": "stripe", "SECRETS": [STRIPE_SECRET]},
        "github": {"SCHEME": "github", "SECRETS": [GITHUB_SECRET]},
        "small": {"SCHEME": "standard", "SECRETS": [SHOP_SECRET], "MAX_BODY_BYTES": 1024},
        "keyed": {
            "SCHEME": "standard",
            "SECRETS": [SHOP_SECRET],
            "EVENT_KEY": "tests.support.signing.order_version_key",
        },
    },
    # for the real Celery worker the failure tests start (it cannot see override_settings)
    "HANDLERS": {"test.hang": "tests.support.handlers.hangs_on_first_attempt"},
    "SECRET_ENCRYPTION_KEYS": [SECRET_ENCRYPTION_KEY],
    # for a served instance behind nginx (tests/support/served.py); unset, no proxy is trusted
    "TRUSTED_PROXIES": env("WEBHOOK_TRUSTED_PROXIES", default=None),
    # the suite's merchants listen on loopback (tests/core/test_egress.py and the relay's
    # egress tests check the guard without this)
    "EGRESS_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
}

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/15")
CELERY_BROKER_URL = per_test_process_broker(CELERY_BROKER_URL)
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# the demo's timeline logging in a process a test starts and reads the log of (a relay:
# tests/support/worker.py); in the suite itself, pytest captures what is logged
if not env.bool("WEBHOOK_TEST_PROCESS_LOGS", default=False):
    LOGGING = {"version": 1, "disable_existing_loggers": False}
# a test of real processes that watches beat's work run on time under load
# (tests/outbound/test_starvation.py): every interval task of beat's this often, and the
# "small" source watched for silence
if beat_seconds := env.float("WEBHOOK_TEST_BEAT_SECONDS", default=0.0):
    CELERY_BEAT_SCHEDULE = {  # noqa: F405
        name: {**entry, "schedule": beat_seconds} if isinstance(entry["schedule"], float) else entry
        for name, entry in CELERY_BEAT_SCHEDULE.items()  # noqa: F405
    }
if silence_seconds := env.int("WEBHOOK_TEST_SMALL_SILENCE_SECONDS", default=0):
    WEBHOOK_RECEIVER["SOURCES"]["small"]["SILENCE_AFTER_SECONDS"] = silence_seconds
