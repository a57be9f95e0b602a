"""Settings of the demo host project: the only place that reads the environment.

Defaults are production-sound (DEBUG off, persistent database connections with health
checks). With DATABASE_URL and CELERY_BROKER_URL unset it runs on an embedded default
that needs no server: a SQLite file and a filesystem broker under ./var/.
"""

from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from project import logs

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # optional; real environment variables win
# the embedded default's files: SQLite database, filesystem broker, beat's schedule
VAR_DIR = Path(env("DEMO_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="insecure-dev-only-set-DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

# Served over HTTPS, with TLS ended by nginx (or a load balancer) in front: the proxy says
# so in X-Forwarded-Proto (deploy/nginx.conf sets it), plain HTTP is redirected, the
# admin's cookies travel over TLS only, and browsers are told to stay on HTTPS
# (DJANGO_HSTS_SECONDS: an hour to start with; raise it once HTTPS is known to stay).
# Senders never follow a redirect of a POST: give them the https:// address.
if env.bool("DJANGO_HTTPS", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=3600)
    # a host name of its own (webhooks.example.com) can promise these; a shared one
    # must decide for every subdomain first
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=False)
    SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "health_check",  # /health/: the library's view renders its template for HTML probes
    "webhook_receiver",
    "project.shop",  # the demo commerce domain: the host of the receiver's handlers
]

# the event catalog's OpenAPI document is made by drf-spectacular, whose webhooks need its
# schema class (webhook_receiver.W007)
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN,
    # so concurrent claims queue instead of failing with "database is locked". The busy
    # timeout (``timeout``, seconds) is SQLite's only bound on that wait: a writer that
    # holds the database (a migration) fails a delivery after it, then its capture and
    # the 503's audit record after as long each: a 503 within a sender's own 10 s.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 3,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
elif env.bool("DATABASE_SERVER_SIDE_BINDING", default=True):
    # PostgreSQL: server-side parameters let psycopg prepare the hot path's statements on
    # each persistent connection, so they are parsed and planned once, not per request.
    # Turn off behind a pooler that cannot keep prepared statements (PgBouncer in
    # transaction mode before 1.21).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=env.int("DATABASE_PREPARE_THRESHOLD", default=5)
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database host that does not answer (a partition, a server frozen) fails a new
    # connection within seconds, not the system's two minutes: a request answers 503,
    # webhook_status exits 3, /health/ says so.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5)
    )


def for_transaction_pooling(database: dict) -> None:
    """Settings for a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``), which hands each transaction whichever server connection is free:
    nothing may live on a session. psycopg prepares a statement on its server
    connection after ``prepare_threshold`` runs, and the next transaction on another one
    fails with 'prepared statement "_pg3_0" already exists' (or 'does not exist'): no
    prepared statements. A server-side cursor (``QuerySet.iterator()``) outlives its
    transaction: off. The app itself keeps nothing on a session (its SET are
    set_config(…, true), local to the transaction; no advisory lock, LISTEN or WITH HOLD
    cursor), and PgBouncer restores TimeZone and client_encoding per client."""
    database.setdefault("OPTIONS", {})["prepare_threshold"] = None
    database["DISABLE_SERVER_SIDE_CURSORS"] = True


# "session" (a direct connection, or a pooler in session mode) or "transaction"
DATABASE_POOL_MODE = env.str("DATABASE_POOL_MODE", default="session")
if DATABASE_POOL_MODE not in ("session", "transaction"):
    raise ImproperlyConfigured(
        f"DATABASE_POOL_MODE={DATABASE_POOL_MODE!r}: write session (the default) or transaction"
    )
if DATABASE_POOL_MODE == "transaction" and "postgresql" in DATABASES["default"]["ENGINE"]:
    for_transaction_pooling(DATABASES["default"])

# Persistent connections, checked before reuse: no per-request connection set-up.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=600)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
# the languages a request may ask for (the merchant portal answers in it: French ships
# with the app); anything else gets LANGUAGE_CODE
LANGUAGES = [("en", "English"), ("fr", "Français")]
TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- webhook_receiver ----------------------------------------------------------------


def _served_portal() -> str | None:
    """The portal's address on the server `make run` runs now (project/devserver.py
    writes where it serves), or None."""
    written = VAR_DIR / "devserver-address"
    return f"{written.read_text().strip()}/webhooks-portal/" if written.exists() else None


WEBHOOK_RECEIVER = {
    "SOURCES": {
        "shop": {
            "SCHEME": "standard",
            "SECRETS": env.list("SHOP_WEBHOOK_SECRETS", default=[]),
            "TOLERANCE_SECONDS": env.int("SHOP_WEBHOOK_TOLERANCE_SECONDS", default=300),
            "MAX_BODY_BYTES": env.int("SHOP_WEBHOOK_MAX_BODY_BYTES", default=1024 * 1024),
            # no accepted event for this long pages someone (0: never)
            "SILENCE_AFTER_SECONDS": env.int("SHOP_SILENCE_AFTER_SECONDS", default=1200),
            # the shop's record of truth, through the http contract; off without a URL
            "RECONCILE": (
                {
                    "ADAPTER": "http",
                    "OPTIONS": {
                        "URL": env("SHOP_RECONCILE_URL"),
                        "TOKEN": env("SHOP_RECONCILE_TOKEN", default=""),
                    },
                }
                if env("SHOP_RECONCILE_URL", default="")
                else None
            ),
        },
    },
    # reconciliation asks the shop how its order states differ from what the sender lists
    "STATE_COMPARISON": "project.shop.reconcile.OrderStates",
    "AUDIT_RETENTION_DAYS": env.int("WEBHOOK_AUDIT_RETENTION_DAYS", default=30),
    "RECEIPT_RETENTION_DAYS": env.int("WEBHOOK_RECEIPT_RETENTION_DAYS", default=35),
    "LOCK_TIMEOUT_MS": env.int("WEBHOOK_LOCK_TIMEOUT_MS", default=2000),
    "STATEMENT_TIMEOUT_MS": env.int("WEBHOOK_STATEMENT_TIMEOUT_MS", default=5000),
    # silence alerts: logged at ERROR, mailed to ADMINS, and sent as signals
    "NOTIFIERS": env.list("WEBHOOK_NOTIFIERS", default=["log", "mail_admins", "signal"]),
    # /metrics/ needs "Authorization: Bearer <METRICS_TOKEN>"; unset, it is off
    "METRICS_TOKEN": env("METRICS_TOKEN", default=None),
    # the trace page lists the shop's ledger lines and order state for an event
    "TRACE_EFFECTS": "project.shop.trace.shop_effects",
    # encrypt stored secrets at rest, destinations' and source records' (comma-separated
    # Fernet keys: the first encrypts, every one decrypts); `make run` writes one into
    # .env. A .env from before the rename still names WEBHOOK_DESTINATION_SECRET_KEYS
    "SECRET_ENCRYPTION_KEYS": env.list(
        "WEBHOOK_SECRET_ENCRYPTION_KEYS",
        default=env.list("WEBHOOK_DESTINATION_SECRET_KEYS", default=[]),
    ),
    # behind deploy/nginx.conf: 1 (the client's address is read from X-Forwarded-For)
    "TRUSTED_PROXIES": env("WEBHOOK_TRUSTED_PROXIES", default=None),
    # networks the egress guard lets destinations reach although they are internal
    # (comma-separated CIDRs; `make run` allows loopback, for local merchants)
    "EGRESS_ALLOWED_NETWORKS": env("WEBHOOK_EGRESS_ALLOWED_NETWORKS", default=""),
    # an HTTP proxy every such request goes through as a CONNECT tunnel (smokescreen,
    # a corporate proxy): http://[user:password@]host:port; unset, none
    "EGRESS_PROXY": env("WEBHOOK_EGRESS_PROXY", default=None),
    # where merchants reach the portal: the start of the links `webhook_portal_link`
    # prints; unset, where `make run` serves while it runs (var/devserver-address)
    "PORTAL_URL": env("WEBHOOK_PORTAL_URL", default=None) or _served_portal(),
    # the outbox relay (manage.py webhook_relay): its database connections, its poll for
    # due messages, whether it listens for admissions (false behind PgBouncer in
    # transaction mode, unless the relay's DATABASE_URL goes straight to PostgreSQL), and
    # its requests in flight at most
    "RELAY_DATABASE_CONNECTIONS": env.int("WEBHOOK_RELAY_DATABASE_CONNECTIONS", default=2),
    "RELAY_POLL_SECONDS": env.float("WEBHOOK_RELAY_POLL_SECONDS", default=1.0),
    "RELAY_LISTEN": env.bool("WEBHOOK_RELAY_LISTEN", default=True),
    "RELAY_MAX_REQUESTS": env.int("WEBHOOK_RELAY_MAX_REQUESTS", default=1000),
}
# who mail_admins writes to (comma-separated addresses); with none, nobody is mailed
ADMINS = [(address, address) for address in env.list("DJANGO_ADMINS", default=[])]
# how mail leaves: smtp://user:password@host:587 (django-environ's EMAIL_URL forms);
# consolemail:// prints it instead
vars().update(env.email_url("EMAIL_URL", default="smtp://localhost:25"))

# Django's cache: the outbox's admission window. Unset, local memory (one per process);
# with Redis (CACHE_URL=redis://HOST:6379/1) every process shares it, so the window
# holds across processes.
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
    # The cache is asked inside the claim's transaction: a Redis that hangs must cost a
    # bounded wait (the admission then goes on without it), never hold the claim.
    CACHES["default"].setdefault("OPTIONS", {}).update(
        socket_connect_timeout=0.5, socket_timeout=0.5
    )

# --- the demo merchant (project/shop/merchant.py) ----------------------------------
# The secret it verifies the shop's webhooks with (`make .env` writes one; demo_setup
# gives it to the demo-merchant destination; unset, no demo merchant), and the share of
# them it answers 500, so that the relay's retries show (0: never).
DEMO_MERCHANT_SECRET = env("DEMO_MERCHANT_SECRET", default="")
DEMO_MERCHANT_FAILURE_RATE = env.float("DEMO_MERCHANT_FAILURE_RATE", default=0.2)

# --- Celery ------------------------------------------------------------------------
# (a host in the URL, or kombu warns of its absence at every connection)
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="filesystem://localhost//")
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Sending a task (beat's schedule, a retry queued by the web) tries once more at
    # once, then gives up, rather than kombu's ~6 s of retries: a web request must not
    # wait for a broker that is down (the next sweep makes up for it). The worker's own
    # connection keeps Celery's retries.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 1, "interval_start": 0}
    # kombu's Redis transport, with a channel that closes whole when Redis goes away:
    # without it a Redis restart ends a worker running a task (docs/deploying.md)
    CELERY_BROKER_TRANSPORT = "webhook_receiver.core.broker:Transport"
elif CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _folder in (_broker_dir, VAR_DIR / "broker-control"):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(VAR_DIR / "broker-control"),
    }
# At-least-once work: acknowledge after the task, redeliver when a worker dies, and
# bound every task's run time. Tasks are idempotent; the database arbitrates.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "retry-failed-webhook-events": {
        "task": "webhook_receiver.retry_failed_events",
        "schedule": env.float("WEBHOOK_RETRY_SWEEP_SECONDS", default=15.0),
    },
    "reconcile-webhook-sources": {
        "task": "webhook_receiver.reconcile_sources",
        "schedule": crontab(minute="*/15"),
    },
    "check-webhook-silence": {
        "task": "webhook_receiver.check_silence",
        "schedule": 60.0,
    },
    "beat-heartbeat": {
        "task": "webhook_receiver.beat_heartbeat",
        # stale after two intervals: a stopped worker or beat is said within 40 s
        "schedule": 20.0,
    },
    "purge-webhook-audit-records": {
        "task": "webhook_receiver.purge_audit_records",
        "schedule": crontab(minute=17),
    },
    "purge-webhook-receipts": {
        "task": "webhook_receiver.purge_receipts",
        "schedule": crontab(minute=27),
    },
    "purge-webhook-outbox": {
        "task": "webhook_receiver.purge_outbox",
        "schedule": crontab(minute=37, hour=3),
    },
    "purge-failed-webhook-events": {
        "task": "webhook_receiver.purge_failed_events",
        "schedule": crontab(minute=47),
    },
}

# One timeline for every process (project/logs.py): time, level, logger, process.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"timeline": {"format": logs.LINE}},
    # a broker outage is a line when it starts and one when it ends, per process, not
    # beat's traceback per scheduled task or the worker's line per reconnection attempt
    "filters": {"broker_outage": {"()": "webhook_receiver.core.broker.BrokerOutageLines"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "timeline"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {
        # Beat schedules a sweep every few seconds: a line for each task sent, received
        # and succeeded would bury what matters. Failures still log (at ERROR).
        **{
            name: {"level": env("CELERY_TASK_LOG_LEVEL", default="WARNING")}
            for name in ("celery.worker.strategy", "celery.app.trace")
        },
        "celery.beat": {
            "level": env("CELERY_TASK_LOG_LEVEL", default="WARNING"),
            "filters": ["broker_outage"],
        },
        **{
            name: {"filters": ["broker_outage"]}
            for name in ("celery.worker.consumer.consumer", "celery.worker.consumer.connection")
        },
        # libraries' line per routine call; LIBRARY_LOG_LEVEL=INFO brings them back
        **{
            name: {"level": env("LIBRARY_LOG_LEVEL", default=level)}
            for name, level in logs.QUIET_LIBRARIES.items()
        },
    },
}
# Celery replaces the root logger's handler in its worker and beat: the same lines there
CELERY_WORKER_LOG_FORMAT = logs.LINE
CELERY_WORKER_TASK_LOG_FORMAT = logs.TASK_LINE
