"""Behind PgBouncer in transaction mode, the pooler in front of PostgreSQL once web nodes
and workers multiply: each transaction gets whichever server connection is free.

psycopg prepares a statement after five runs on its server connection; the next
transaction, on another, then fails ('prepared statement "_pg3_0" already exists'), and
the receiver deferred deliveries (202) instead of applying them. DATABASE_POOL_MODE=
transaction (project/settings.py, ``for_transaction_pooling``) turns prepared statements
and server-side cursors off; the app keeps nothing on a session."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from django.db import connection

from tests.support.commands import python
from tests.support.private_servers import PrivatePgBouncer, pgbouncer, running_pgbouncer  # noqa: F401 (fixture)
from tests.support.served import served_gunicorn
from tests.support.signing import event_body, standard_headers
from webhook_receiver.models import WebhookReceipt

THREADS = 20


def transactions_through(port: int, database: str, prepare_threshold: int | None) -> list[str]:
    """Each of THREADS clients runs the same statement ten times, a transaction each, as
    a Django worker does; the errors they met."""
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def client(n: int) -> None:
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname={database}"
        with psycopg.connect(dsn, prepare_threshold=prepare_threshold) as conn:
            start.wait()
            for i in range(10):
                try:
                    with conn.transaction():
                        conn.execute("SELECT %s::int + %s::int", [n, i]).fetchone()
                except psycopg.Error as exc:
                    with lock:
                        errors.append(str(exc).splitlines()[0])

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(client, range(THREADS)))
    return errors


@pytest.mark.postgres_only("PgBouncer pools PostgreSQL connections")
@pytest.mark.django_db(transaction=True)
def test_prepared_statements_collide_behind_the_pooler_and_are_off_in_its_mode(pgbouncer):  # noqa: F811
    database = connection.settings_dict["NAME"]

    prepared = transactions_through(pgbouncer.port, database, prepare_threshold=5)
    unprepared = transactions_through(pgbouncer.port, database, prepare_threshold=None)

    assert prepared and "prepared statement" in prepared[0]
    assert unprepared == []


def served_statuses(bouncer: PrivatePgBouncer, tmp_path, pool_mode: str) -> tuple[list[int], str]:
    """gunicorn (2 workers, persistent connections) through PgBouncer (4 server
    connections), 20 senders at once, 10 events each: the answers, and gunicorn's log."""
    log = tmp_path / "gunicorn.log"
    database = connection.settings_dict["NAME"]
    with served_gunicorn(
        log,
        DATABASE_URL=bouncer.url(database),
        DATABASE_POOL_MODE=pool_mode,
        # persistent connections, as the demo keeps them: psycopg's count of a
        # statement's runs (and so its preparing) lives on the connection
        DATABASE_CONN_MAX_AGE="600",
    ) as server:
        url = f"http://{server.host}:{server.port}/webhooks/shop/"

        def sender(n: int) -> list[int]:
            statuses = []
            with httpx.Client(timeout=10) as client:
                for i in range(10):
                    body = event_body("test.ignored", order_id=f"ord_{n}_{i}")
                    headers = standard_headers(body, msg_id=f"msg_{n}_{i}")
                    statuses.append(client.post(url, content=body, headers=headers).status_code)
            return statuses

        with ThreadPoolExecutor(THREADS) as pool:
            statuses = [s for batch in pool.map(sender, range(THREADS)) for s in batch]
    return statuses, log.read_text()


@pytest.mark.postgres_only("PgBouncer pools PostgreSQL connections")
@pytest.mark.django_db(transaction=True)
def test_the_served_app_behind_the_pooler_applies_every_concurrent_delivery(
    pgbouncer,  # noqa: F811
    tmp_path,
):
    statuses, log = served_statuses(pgbouncer, tmp_path, "transaction")

    assert statuses == [200] * THREADS * 10, log[-3000:]
    assert WebhookReceipt.objects.filter(source="shop").count() == THREADS * 10
    assert "ProgrammingError" not in log


@pytest.mark.postgres_only("PgBouncer pools PostgreSQL connections")
@pytest.mark.django_db(transaction=True)
def test_without_the_pool_mode_the_served_app_defers_what_it_should_apply(tmp_path):
    # the fault the setting is for, shown: nothing is lost, but deliveries are deferred.
    # One server connection for both gunicorn workers: each prepares its statements
    # under the same names on it, so the collision is certain, not a matter of timing
    with running_pgbouncer(pool_size=1) as bouncer:
        statuses, log = served_statuses(bouncer, tmp_path, "session")

    assert 202 in statuses and "prepared statement" in log


@pytest.mark.parametrize(
    ("mode", "prepare_threshold", "server_side_cursors"),
    [("session", 5, True), ("transaction", None, False)],
)
def test_the_demo_reads_the_pool_mode_from_its_environment(
    mode, prepare_threshold, server_side_cursors
):
    code = (
        "from django.conf import settings; import django; django.setup(); "
        "d = settings.DATABASES['default']; "
        "print(d['OPTIONS'].get('prepare_threshold'), not d.get('DISABLE_SERVER_SIDE_CURSORS'))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/any",
        "DATABASE_POOL_MODE": mode,
    }
    done = python("-c", code, env=env)

    assert done.stdout.split() == [str(prepare_threshold), str(server_side_cursors)]


def test_an_unknown_pool_mode_is_refused_with_what_to_write():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    env["DATABASE_POOL_MODE"] = "statement"
    done = python("-c", "import project.settings", env=env)

    assert done.returncode != 0
    assert "DATABASE_POOL_MODE='statement': write session (the default) or transaction" in (
        done.stderr
    )
