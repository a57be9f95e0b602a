"""The logs an operator reads, as a timeline: the demo served as deployed (gunicorn with
deploy/gunicorn.conf.py, the demo's settings) on a PostgreSQL cluster of the test's own,
stopped for a while and started again; and a deferred event's line.

Every line carries its time, level, logger and process; a request that fails is one
line of the app's (with its event's key) beside gunicorn's access line, never twice; a
traceback is shown once per error class and process, not once per request or probe."""

from __future__ import annotations

import http.client
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench.server import GUNICORN_WSGI, GunicornServer
from tests.settings import SHOP_SECRET
from tests.support.paths import REPO
from tests.support.private_servers import PrivatePostgres, private_postgres  # noqa: F401 (fixture)
from tests.support.served import listening
from tests.support.signing import reserved, standard_headers
from webhook_receiver.core import logs

CONFIG = REPO / "deploy" / "gunicorn.conf.py"
LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) "
    r"\[(\d+)\] (.*)$"
)


@dataclass
class Record:
    level: str
    logger: str
    process: int
    message: str
    # the lines after it that are not records of their own: a traceback
    more: list[str] = field(default_factory=list)


def records(text: str) -> list[Record]:
    found: list[Record] = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            level, logger, process, message = match.groups()
            found.append(Record(level, logger, int(process), message))
        else:
            assert found, f"the log starts with a line of no record: {line!r}"
            found[-1].more.append(line)
    return found


class DeployedGunicorn(GunicornServer):
    """gunicorn as deploy/gunicorn.conf.py runs it (its log format and levels, its access
    log), on a port of the test's own, with two workers."""

    def command(self) -> list[str]:
        return [
            *GUNICORN_WSGI,
            "--config",
            str(CONFIG),
            "--bind",
            f"{self.host}:{self.port}",
            "--workers",
            "2",
        ]

    def ready(self) -> bool:
        # listening, without a request of its own: every request leaves lines
        return listening(self.port)


def demo_env(database_url: str, var_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": database_url,
        "DEMO_VAR_DIR": str(var_dir),
        "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
    }
    for name in ("GUNICORN_CMD_ARGS", "PROMETHEUS_MULTIPROC_DIR", "CACHE_URL", "LOG_LEVEL"):
        env.pop(name, None)
    return env


def call(server: GunicornServer, method: str, path: str, body: bytes = b"", msg_id: str = ""):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=20)
    headers = {"Content-Type": "application/json"}
    if msg_id:
        headers |= standard_headers(body, msg_id=msg_id)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def deliver(server: GunicornServer, msg_id: str) -> int:
    return call(server, "POST", "/webhooks/shop/", reserved(msg_id, ("SKU", 1)), msg_id)


def probe(server: GunicornServer) -> int:
    return call(server, "GET", "/health/?format=json")


def test_a_database_stop_logs_one_line_per_request_and_few_tracebacks(
    private_postgres: PrivatePostgres,  # noqa: F811
    tmp_path,
):
    # given: the demo migrated on its own cluster, with a fresh heartbeat, served as
    # deployed
    import subprocess

    env = demo_env(private_postgres.url, tmp_path)
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"]
    subprocess.run(migrate, cwd=REPO, env=env, check=True, timeout=300)
    with private_postgres.connect() as conn:
        conn.execute("INSERT INTO webhook_receiver_heartbeat VALUES ('beat', now())")
    (tmp_path / "static").mkdir()  # as collectstatic leaves it: whitenoise warns otherwise
    log = tmp_path / "gunicorn.log"

    with DeployedGunicorn(env, log) as server:
        # when: traffic while the database is up, while it is stopped, and once it is back
        up = [deliver(server, f"up_{n}") for n in range(2)] + [probe(server)]
        private_postgres.stop()
        down = [deliver(server, f"down_{n}") for n in range(6)]
        down += [probe(server) for _ in range(3)]
        private_postgres.start()
        back = [deliver(server, f"back_{n}") for n in range(2)]
    text = log.read_text()

    # then: the answers, as documented
    assert (up, down, back) == ([200, 200, 200], [503] * 9, [200, 200]), text

    # every line a record with time, level, logger and process
    lines = records(text)
    assert {r.logger for r in lines} >= {"gunicorn.error", "gunicorn.access"}

    # one access line per request, in the same format
    access = [r for r in lines if r.logger == "gunicorn.access"]
    assert len(access) == 14, text
    assert sum(" 503 " in r.message for r in access) == 9

    # one line of the app's per failed request, each with its key; nothing twice
    app = [r for r in lines if r.logger.startswith("webhook_receiver")]
    not_stored = [r for r in app if "neither applied nor captured" in r.message]
    keys = [re.search(r" event_key=(\S+)", r.message).group(1) for r in not_stored]
    assert sorted(keys) == [f"down_{n}" for n in range(6)], text
    failing = [r for r in app if r.message.startswith("health check failing: ")]
    assert len(failing) == 3
    assert all("cannot read the heartbeat: database error" in r.message for r in failing)
    assert len(app) == 9, "\n".join(r.message for r in app)
    assert not [r for r in lines if r.logger in ("django.request", "health_check")], text

    # a traceback once per error class and worker, not once per request or probe
    with_traceback = [r for r in lines if r.more]
    assert len(with_traceback) <= 2, text
    assert all(r in not_stored for r in with_traceback)


@pytest.mark.postgres_only("a lock held by another session")
@pytest.mark.django_db(transaction=True)
def test_a_deferred_event_is_one_line_with_its_key_its_attempt_and_what_comes_next(
    client, settings, caplog
):
    import psycopg

    from tests.support.http import post

    # given: the ledger locked by another session, so that a reservation fails
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "LOCK_TIMEOUT_MS": 200}
    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], host=db["HOST"], port=db["PORT"], user=db["USER"])
    holder.execute("LOCK TABLE shop_inventoryledgerentry IN ACCESS EXCLUSIVE MODE")
    body = reserved("o_line", ("S-L", 1))
    logs.tracebacks_shown_forget()

    # when
    try:
        with caplog.at_level(logging.INFO, logger="webhook_receiver"):
            started = timezone.now()
            answer = post(client, "shop", body, standard_headers(body, msg_id="msg_line"))
    finally:
        holder.rollback()
        holder.close()

    # then: one line, WARNING, naming the event, the attempt, the error and the retry
    assert answer.status_code == 202
    (line,) = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert text.startswith("webhook event deferred: source=shop event_key=msg_line ")
    assert " event_type=inventory.reserved trigger=delivery attempt=1/8 " in text
    assert " error=django.db.utils.OperationalError " in text
    assert ' message="canceling statement due to lock timeout" ' in text
    due = re.search(r' next="retry at (\S+) \(in (\d+) s\)"$', text)
    assert due is not None, text
    assert timezone.datetime.fromisoformat(due.group(1)) >= started
    assert line.webhook["event_key"] == "msg_line"  # the same fields, structured

    # and its retry, once the lock is gone, is one line too
    from webhook_receiver.inbound.failures import retry_failed_events

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="webhook_receiver"):
        retry_failed_events(now=timezone.now() + timezone.timedelta(days=1))
    (line,) = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert line.levelno == logging.INFO
    assert line.getMessage() == (
        "webhook event resolved: source=shop event_key=msg_line "
        "event_type=inventory.reserved trigger=retry attempt=2 result=applied"
    )


# --- a sender's text in a key=value line --------------------------------------------------

PAIR = re.compile(r'([a-z_0-9]+)=("(?:[^"\\]|\\.)*"|[^ "]+)')


def parsed(pairs: str) -> list[tuple[str, str]]:
    """``key=value`` pairs as a log reader splits them: values quoted when they hold a
    space, with backslash escapes; nothing else between the pairs than one space."""
    found, at = [], 0
    while at < len(pairs):
        match = PAIR.match(pairs, at)
        assert match is not None, (pairs, at)
        found.append(match.groups())
        at = match.end()
        if at < len(pairs):
            assert pairs[at] == " ", (pairs, at)
            at += 1
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=4))
def test_a_senders_text_stays_one_line_and_cannot_add_a_field(values):
    # given: values a sender chose (an event key, an event type), as the fields of a line
    fields = {f"field{n}": value for n, value in enumerate(values)}
    logger = logging.getLogger("tests.fuzz.log_line")
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        # when
        logs.log_line(logger, logging.WARNING, "webhook event deferred", **fields)
    finally:
        logger.removeHandler(handler)

    # then: one line, whose pairs are exactly the fields given, in order
    (record,) = seen
    message = record.getMessage()
    assert len(message.splitlines()) == 1
    assert message.isprintable()
    what, pairs = message.split(": ", 1)
    assert what == "webhook event deferred"
    assert [key for key, _ in parsed(pairs)] == list(fields)
