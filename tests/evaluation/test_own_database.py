"""The run's own database (on PostgreSQL ``<NAME>_webhook_eval``, beside the configured
one): a database of that name the run did not make is left as it is unless --force says
otherwise, and the one it made is dropped on every way out, SIGTERM and Ctrl-C included.

Every name here is derived from this test run's own test database, so that a run beside
it (another checkout's tests, someone's webhook_eval) is never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection

from tests.settings import SHOP_SECRET
from tests.support.commands import manage
from tests.support.paths import REPO

pytestmark = pytest.mark.postgres_only("the run's own database is made beside the configured one")

TINY = "tests/evaluation/data/tiny.yaml"


def _server(dbname: str = "postgres") -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname=dbname,
        autocommit=True,
    )


def _exists(name: str) -> bool:
    with _server() as server:
        return (
            server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is not None
        )


def _drop(name: str) -> None:
    with _server() as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def host() -> Iterator[str]:
    """The configured database the command is given (it need not exist), named after
    this run's test database; its run's database, ``<host>_webhook_eval``, is dropped
    after the test whatever happened."""
    name = f"{connection.creation._get_test_db_name()}_own"
    yield name
    _drop(f"{name}_webhook_eval")


@pytest.fixture
def someones_database(host: str) -> str:
    """``<host>_webhook_eval`` made before the run, by someone else, holding a table."""
    name = f"{host}_webhook_eval"
    _drop(name)
    with _server() as server:
        server.execute(f'CREATE DATABASE "{name}"')
    with _server(name) as theirs:
        theirs.execute("CREATE TABLE notes (body text)")
        theirs.execute("INSERT INTO notes VALUES ('keep me')")
    return name


def _notes(name: str) -> list[str]:
    with _server(name) as theirs:
        return [row[0] for row in theirs.execute("SELECT body FROM notes").fetchall()]


def _environment(host: str) -> dict[str, str]:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{host}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
    }
    env.pop("CELERY_BROKER_URL", None)
    return env


@pytest.fixture
def eval_command(host: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return manage("webhook_eval", *args, env=_environment(host), timeout=300)

    return run


def test_a_database_the_run_did_not_make_is_left_as_it_is(eval_command, someones_database):
    done = eval_command(TINY)

    assert done.returncode == 3, done.stderr
    assert (
        f"webhook_eval: the database {someones_database} exists, and this run did not make it"
        in done.stderr
    )
    assert f"dropdb {someones_database}" in done.stderr and "--force" in done.stderr
    assert _notes(someones_database) == ["keep me"]


def test_with_force_it_is_dropped_made_afresh_and_dropped_after(eval_command, someones_database):
    done = eval_command(TINY, "--force")

    assert done.returncode == 0, done.stderr
    assert "  PASS  tiny " in done.stdout
    assert not _exists(someones_database)


def test_a_normal_run_leaves_nothing_behind(eval_command, host):
    done = eval_command(TINY, "-v", "2")

    assert done.returncode == 0, done.stderr
    assert f"made its database {host}_webhook_eval" in done.stderr
    assert f"dropped its database {host}_webhook_eval" in done.stderr
    assert not _exists(f"{host}_webhook_eval")


def _default_sigint() -> None:
    # a shell starts a background job with SIGINT ignored, and Python then never turns
    # it into KeyboardInterrupt: the run is given Ctrl-C as a terminal would give it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_until_made(name: str) -> None:
    deadline = time.monotonic() + 60
    while not _exists(name):
        assert time.monotonic() < deadline, f"{name} was never made"
        time.sleep(0.02)


@pytest.mark.parametrize("moment", ["while it migrates", "mid-run"])
@pytest.mark.parametrize(
    ("stop", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "Ctrl-C"]
)
def test_a_run_stopped_drops_its_database_and_says_so(host, stop, status, moment):
    own = f"{host}_webhook_eval"
    # flash-sale runs for half a minute and more: long enough to be stopped in the middle
    process = subprocess.Popen(
        [sys.executable, "manage.py", "webhook_eval", "flash-sale", "-v", "1"],
        cwd=REPO,
        env=_environment(host),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    watchdog = threading.Timer(180, process.kill)
    watchdog.start()
    try:
        assert process.stderr is not None
        if moment == "while it migrates":
            # made, and being migrated: the statements of migrate are in flight
            _wait_until_made(own)
        else:
            said = []
            for line in process.stderr:
                said.append(line)
                if line.startswith("running flash-sale"):
                    break
            assert process.poll() is None, "".join(said)
            assert _exists(own)
            time.sleep(1)  # into the simulation

        sent = time.monotonic()
        process.send_signal(stop)
        rest = process.stderr.read()
        process.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        watchdog.cancel()
        process.kill()

    assert process.returncode == status, rest
    assert took < 10
    assert f"webhook_eval: interrupted; dropped its database {own}" in rest
    assert "Traceback" not in rest
    assert not _exists(own)
