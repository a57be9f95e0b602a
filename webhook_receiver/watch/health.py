"""GET /health/ for load balancers and orchestrators: 200 when the receiver can do its
work, 503 when it cannot.

Five checks, on django-health-check's view:

- ``Database`` (the library's): ``SELECT 1`` on the default database.
- ``Broker``: Celery's configured broker accepts a connection. Retries and every beat
  job travel through it.
- ``BeatHeartbeat``: beat's heartbeat task ran within two of its intervals. Beat
  sends it and a worker runs it, so a fresh heartbeat means beat, broker and at least one
  worker all work: without them failed events are never retried and silence never noticed.
  Its read waits at most STATUS_TIMEOUT_SECONDS (a lock, a slow database): past that the
  answer is 503, "database not answering within N s", never a probe that times out.
  Stale, after a broker outage, it says that it waits for beat's next heartbeat (at
  most one interval, 20 s on the demo's schedule, once beat and a worker reconnect):
  only that heartbeat shows they came through the outage (a worker may not).
- ``RelayHeartbeat``: a relay process (``manage.py webhook_relay``) recorded its
  heartbeat within 30 s, when there is a destination to send to: without one nothing
  is sent.
- ``Tables``: none of the app's tables is held locked against reads by another session
  (LOCK TABLE, a migration, VACUUM FULL) for a second (at most STATUS_TIMEOUT_SECONDS):
  503 naming the tables within seconds, even for a probe that waited for a worker
  behind deliveries held by that lock.

A host includes ``health_view`` in its urls (``path("health/", health_view)``), or
composes its own ``HealthView.as_view(checks=[...])`` from these classes and the
library's. The library's app, ``"health_check"``, must be in INSTALLED_APPS: its
template answers requests that accept HTML (and ``*/*``, what most probes send).

A freshly started stack answers 503 until beat's first heartbeat (about 20 s, plus the
worker's start): deliberately, since until then nothing has shown that retries and
watches run. Give orchestrators a start period of a minute or two. The beat check is
about the whole stack, not one web process: a probe that restarts or drops web nodes on
failure (a liveness probe, a per-node load-balancer check) should use
``HealthView.as_view(checks=[Database, Broker])`` instead, so that a stopped beat does
not take the endpoint down with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from celery.app import app_or_default
from django.contrib.auth.decorators import login_not_required
from django.db import Error as DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from health_check.base import HealthCheck
from health_check.checks import Database
from health_check.exceptions import ServiceUnavailable
from health_check.views import HealthCheckView

from ..conf import app_settings
from ..core import logs
from ..core.bounds import NotAnswering, database_deadline
from .heartbeat import BEAT, heartbeat_interval, heartbeat_seen_at, heartbeat_stale_after
from .models import Heartbeat
from .readings import app_tables, locked_tables
from .relays import RELAY_STALE_AFTER, relay_needed, relays_seen_at

__all__ = [
    "BeatHeartbeat",
    "Broker",
    "Database",
    "HealthView",
    "RelayHeartbeat",
    "Tables",
    "health_view",
]

logger = logging.getLogger(__name__)

# the Tables check's wait on a lock, at most STATUS_TIMEOUT_SECONDS (_lock_seconds)
TABLES_LOCK_SECONDS = 1.0


@dataclasses.dataclass
class Broker(HealthCheck):
    """Celery's broker accepts a connection: redis (connect and PING), amqp, or the
    embedded ``filesystem://`` broker (its folders exist and are writable).

    ``url`` and ``transport_options``: another broker than the configured one, with
    options added to the configured ones. Neither is shown in reports (a URL may hold a
    password).
    """

    url: str | None = dataclasses.field(default=None, repr=False)
    transport_options: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    # the whole probe's budget (the connect timeout is Celery's broker_connection_timeout)
    timeout: datetime.timedelta = dataclasses.field(
        default=datetime.timedelta(seconds=5), repr=False
    )

    def __repr__(self) -> str:
        # the transport only: a broker URL may carry credentials
        return f"Broker(transport={self._transport()!r})"

    def _transport(self) -> str:
        url = self.url or app_or_default().conf.broker_url or ""
        return urlsplit(url).scheme or "unknown"

    def run(self) -> None:
        app = app_or_default()
        seconds = self.timeout.total_seconds()
        # another broker's URL names its own transport: Celery would otherwise impose
        # the configured broker_transport (a host's subclass of the Redis one) on it
        transport = urlsplit(self.url).scheme if self.url else None
        connection = app.connection_for_write(
            self.url, transport=transport, transport_options=self.transport_options
        )
        try:
            # one quick retry: a blip is not an outage, a refused port fails in milliseconds
            connection.ensure_connection(
                max_retries=1,
                interval_start=0,
                # kombu takes any number of seconds (a float: the check's timeout); its
                # stubs say int
                timeout=seconds,  # type: ignore[arg-type]
            )
            if connection.transport.driver_type == "filesystem":
                # kombu keeps a dict (its stubs allow None)
                _filesystem_folders_check(connection.transport_options or {})
        except ServiceUnavailable:
            raise
        except Exception as exc:  # kombu raises the transport's own errors
            raise ServiceUnavailable(
                f"cannot connect to the {self._transport()} broker ({type(exc).__name__})"
            ) from exc
        finally:
            connection.release()


def _filesystem_folders_check(options: dict[str, Any]) -> None:
    """The filesystem broker has no server to answer: it works while its folders do."""
    # kombu's defaults when the options leave them out: folders relative to the cwd
    for key, default in (("data_folder_in", "data_in"), ("data_folder_out", "data_out")):
        folder = options.get(key, default)
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            raise ServiceUnavailable(f"filesystem broker: {key} is missing or not writable")


@dataclasses.dataclass
class BeatHeartbeat(HealthCheck):
    """Beat's heartbeat (the ``webhook_receiver.beat_heartbeat`` task) was recorded no
    longer ago than ``max_age`` (default: the status's rule, ``heartbeat_stale_after``:
    two of beat's intervals, at most HEARTBEAT_MAX_AGE_SECONDS), so that a frozen worker
    or beat is a 503 within 40 s on the demo's 20 s schedule.

    A process that has just started fails this until beat's first heartbeat (about 20 s
    on the demo's schedule): until then nothing has shown that beat and a worker run.
    """

    name: str = BEAT
    max_age: datetime.timedelta | None = dataclasses.field(default=None, repr=False)

    async def run(self) -> None:
        try:
            # thread_sensitive: the request's own thread and database connection, which
            # stays persistent, rather than a new connection per probe in a pool thread
            seen_at = await sync_to_async(_seen_at, thread_sensitive=True)(self.name)
        except NotAnswering as exc:  # a lock, or a database too slow to tell
            raise ServiceUnavailable(f"cannot read the heartbeat: {exc}") from exc
        except DatabaseError as exc:
            raise ServiceUnavailable("cannot read the heartbeat: database error") from exc
        max_age = self.max_age or heartbeat_stale_after()
        if seen_at is None:
            raise ServiceUnavailable(
                f"{self.name} never seen: no heartbeat recorded (is celery beat running, "
                "and a worker?)"
            )
        age = timezone.now() - seen_at
        if age > max_age:
            raise ServiceUnavailable(
                f"{self.name} last seen {int(age.total_seconds())} s ago "
                f"(at {seen_at.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC; "
                f"at most {int(max_age.total_seconds())} s){_waits_for_next()}"
            )


@dataclasses.dataclass
class RelayHeartbeat(HealthCheck):
    """A relay process (``manage.py webhook_relay``) recorded its heartbeat no longer
    ago than RELAY_STALE_AFTER (30 s), when there is a destination to send to; a
    deployment that sends nothing needs no relay, and passes."""

    def __repr__(self) -> str:
        return "RelayHeartbeat()"

    async def run(self) -> None:
        try:
            seen_at = await sync_to_async(_relays_seen_at, thread_sensitive=True)()
            fresh = seen_at is not None and timezone.now() - seen_at <= RELAY_STALE_AFTER
            # a fresh heartbeat needs no more reading; a stale one matters only where
            # there is something to send
            if fresh or not await sync_to_async(_relay_needed, thread_sensitive=True)():
                return
        except NotAnswering as exc:
            raise ServiceUnavailable(f"cannot read the relays' heartbeats: {exc}") from exc
        except DatabaseError as exc:
            raise ServiceUnavailable("cannot read the relays' heartbeats: database error") from exc
        if seen_at is None:
            raise ServiceUnavailable(
                "no relay running: none ever seen (manage.py webhook_relay sends the outbox)"
            )
        age = timezone.now() - seen_at
        raise ServiceUnavailable(
            f"no relay running: the last one seen {int(age.total_seconds())} s ago "
            f"(at most {int(RELAY_STALE_AFTER.total_seconds())} s)"
        )


def _relays_seen_at() -> datetime.datetime | None:
    with database_deadline(app_settings().status_timeout_seconds):
        return relays_seen_at()


def _relay_needed() -> bool:
    with database_deadline(app_settings().status_timeout_seconds):
        return relay_needed()


def _waits_for_next() -> str:
    """Why a stale heartbeat keeps the answer 503 once the broker is back: only beat's
    next heartbeat, run by a worker, shows that both came through the outage."""
    interval = heartbeat_interval()
    if interval is None:
        return ""
    every = int(interval.total_seconds())
    return (
        f"; waiting for beat's next heartbeat, sent every {every} s: after a broker "
        f"outage it comes within {every} s of the broker's return, once beat and a "
        "worker reach it again"
    )


@dataclasses.dataclass
class Tables(HealthCheck):
    """None of the app's tables is held locked against reads (ACCESS EXCLUSIVE: a LOCK
    TABLE, a migration, VACUUM FULL) for TABLES_LOCK_SECONDS by another session
    (watch/readings.py's ``locked_tables``): deliveries, retries and the relay would wait
    on it. PostgreSQL only (SQLite locks the whole file, which ``Database`` meets). The
    heartbeat's table is left to BeatHeartbeat, which names a lock on it within its own
    bound: both run on the request's thread, one after the other."""

    def __repr__(self) -> str:
        return "Tables()"

    async def run(self) -> None:
        try:
            locked = await sync_to_async(_locked_tables, thread_sensitive=True)()
        except DatabaseError as exc:
            # NotAnswering names its bound; any other error is the Database check's to name
            reason = str(exc) if isinstance(exc, NotAnswering) else "database error"
            raise ServiceUnavailable(f"cannot read the tables' locks: {reason}") from exc
        if locked:
            raise ServiceUnavailable(
                f"locked against reads for {_lock_seconds():g} s: {', '.join(locked)}"
            )


def _lock_seconds() -> float:
    """How long the check watches a lock before it names it: a second, within
    STATUS_TIMEOUT_SECONDS. A probe that found a worker late (its workers' deliveries
    waiting on that very lock, up to LOCK_TIMEOUT_MS) must still answer within its own
    timeout (5 s), and a lock held for a second already holds deliveries."""
    return min(TABLES_LOCK_SECONDS, app_settings().status_timeout_seconds)


def _locked_tables() -> list[str]:
    tables = [m for m in app_tables() if m is not Heartbeat]
    return locked_tables(tables, _lock_seconds())


def _seen_at(name: str) -> datetime.datetime | None:
    """The heartbeat, read within STATUS_TIMEOUT_SECONDS: in the request's own thread, a
    read that hung would hold the whole probe (the library's timeout cannot cut it)."""
    with database_deadline(app_settings().status_timeout_seconds):
        return heartbeat_seen_at(name)


CHECKS = (Database, Broker, BeatHeartbeat, RelayHeartbeat, Tables)


class HealthView(HealthCheckView):
    """django-health-check's view, answering 503 (not 500) when a check fails: load
    balancers and orchestrators read 503 as "out of rotation", and a 500 would look like
    a crash of the probe itself. JSON with ``Accept: application/json`` or ``?format=json``."""

    checks = CHECKS
    http_method_names = ["get", "head"]

    async def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = await super().get(request, *args, **kwargs)
        failed = [result for result in self.results if result.error]
        if response.status_code == 500 and failed:
            response.status_code = 503
        if response.status_code == 503:
            # One line a failing probe, with every reason and no traceback (a probe fails
            # every few seconds for as long as the outage lasts); Django's own
            # "Service Unavailable: /health/" would only repeat it.
            logger.warning(
                "health check failing: %s",
                "; ".join(f"{result.check!r}: {result.error}" for result in failed),
            )
            logs.mark_logged(response)
        return response


# No login (LoginRequiredMiddleware), no session, no CSRF (GET only).
health_view = login_not_required(HealthView.as_view())
