"""The run's own database (on PostgreSQL ``<NAME>_webhook_eval``, beside the configured
one): a name the server would cut is refused before any statement; a database of that
name no run made is left as it is, --force included; one a killed run left is dropped
only with --force; and the one it made is dropped on every way out, SIGTERM and Ctrl-C
included.

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
from webhook_receiver.evaluation.run import RUN_DATABASE_MARK

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
    assert f"webhook_eval: the database {someones_database} exists, and no run made it" in (
        done.stderr
    )
    assert _notes(someones_database) == ["keep me"]


def test_force_does_not_drop_a_database_no_run_made(eval_command, someones_database):
    done = eval_command(TINY, "--force")

    assert done.returncode == 3, done.stderr
    assert "left as it is, --force included" in done.stderr
    assert _notes(someones_database) == ["keep me"]


@pytest.fixture
def left_by_a_killed_run(host: str) -> str:
    """``<host>_webhook_eval`` as a run killed by SIGKILL leaves it: made and marked."""
    name = f"{host}_webhook_eval"
    _drop(name)
    with _server() as server:
        server.execute(f'CREATE DATABASE "{name}"')
        server.execute(f"COMMENT ON DATABASE \"{name}\" IS '{RUN_DATABASE_MARK}'")
    return name


def test_a_database_a_killed_run_left_is_dropped_only_with_force(
    eval_command, left_by_a_killed_run
):
    refused = eval_command(TINY)
    assert refused.returncode == 3, refused.stderr
    assert "left behind by an earlier run" in refused.stderr and "--force" in refused.stderr
    assert _exists(left_by_a_killed_run)

    done = eval_command(TINY, "--force")

    assert done.returncode == 0, done.stderr
    assert "  PASS  tiny " in done.stdout
    assert not _exists(left_by_a_killed_run)


def _named(prefix: str, size: int, tail: str = "") -> str:
    """A database name of ``size`` bytes: ``prefix``, padding, then ``tail``."""
    pad = size - len(prefix.encode()) - len(tail.encode())
    assert pad > 0
    return prefix + "x" * pad + tail


@pytest.fixture
def long_host() -> Iterator[Callable[[str], str]]:
    """Makes the configured database under a long name, holding a table of notes, and
    drops it after the test."""
    made: list[str] = []

    def make(name: str) -> str:
        _drop(name)
        with _server() as server:
            server.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        with _server(name) as theirs:
            theirs.execute("CREATE TABLE notes (body text)")
            theirs.execute("INSERT INTO notes VALUES ('the shop')")
        return name

    yield make
    for name in made:
        _drop(name)
        _drop(f"{name}_webhook_eval".encode()[:63].decode(errors="ignore"))


@pytest.mark.parametrize("force", [False, True], ids=["plain", "--force"])
@pytest.mark.parametrize(
    "size", [51, 63], ids=["cut to a name of its own", "cut to the host's own name"]
)
def test_a_name_the_server_would_cut_is_refused_before_any_statement(host, long_host, force, size):
    # given: the configured database, named so that <NAME>_webhook_eval is over 63
    # bytes; at 63 the cut name is the configured database itself
    configured = long_host(_named(host, size))
    cut = f"{configured}_webhook_eval".encode()[:63].decode()
    before = _databases(host)

    # when
    done = manage(
        "webhook_eval",
        TINY,
        *(["--force"] if force else []),
        env=_environment(configured),
        timeout=300,
    )

    # then: refused, saying why, and the server holds the same databases as before
    assert done.returncode == 3, done.stderr
    assert "keeps only the first 63 bytes of a name" in done.stderr
    assert "at most 50 bytes" in done.stderr
    assert "dropdb" not in done.stderr
    assert _notes(configured) == ["the shop"]
    assert _databases(host) == before
    assert (cut == configured) is (size == 63)


def test_the_limit_is_counted_in_bytes(host, long_host):
    # 49 characters, 50 bytes: the run's name is 63 bytes and whole
    fits = long_host(_named(host, 50, tail="é"))
    # 50 characters, 51 bytes: it would be cut, although 63 characters
    over = long_host(_named(host, 51, tail="é"))

    done = manage("webhook_eval", TINY, env=_environment(fits), timeout=300)
    refused = manage("webhook_eval", TINY, env=_environment(over), timeout=300)

    assert done.returncode == 0, done.stderr
    assert "  PASS  tiny " in done.stdout
    assert not _exists(f"{fits}_webhook_eval")
    assert refused.returncode == 3, refused.stderr
    assert "64 bytes" in refused.stderr
    assert _notes(fits) == _notes(over) == ["the shop"]


def _databases(prefix: str) -> set[str]:
    """The server's databases named from this test run's own (other processes' come and
    go meanwhile)."""
    with _server() as server:
        rows = server.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]
        ).fetchall()
    return {row[0] for row in rows}


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
