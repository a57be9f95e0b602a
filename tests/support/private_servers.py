"""Servers of a test's own, to stop and start mid-test: a Redis, a PostgreSQL cluster
and a PgBouncer on free loopback ports, in a temporary directory. The shared servers of
this machine are never stopped; a fault that stops a server stops one of these.

PostgreSQL refuses to run as root: under root, its commands run as the ``postgres``
user (Debian's), and the cluster's directory is given to that user.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
import redis

from tests.bench.server import free_port

STARTUP_SECONDS = 30
S = TypeVar("S")


def _wait(condition, what: str, seconds: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {seconds} s")
        time.sleep(0.05)


class _ServerProcess:
    """A server this module starts as a process of its own, its output appended to a log
    in ``directory``; up once it answers, stopped with SIGTERM (a clean shutdown)."""

    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def _launch(self, command: list[str], log: str) -> None:
        with (self.directory / log).open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait(self._answers, Path(command[0]).name)

    def _answers(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop it, if it still runs."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(timeout=10)


class PrivateRedis(_ServerProcess):
    """``redis-server`` on a port of its own, nothing persisted."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("needs redis-server (apt-get install redis-server)")
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        self._launch(command, "redis.log")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb), on a port of its own; ``database`` is
    created once it first starts. Stopped with ``pg_ctl stop -m fast``, as an operator
    or a failover would stop it: sessions are terminated and new ones refused."""

    def __init__(self, directory: Path, database: str = "webhook_receiver") -> None:
        self.directory = directory
        self.data = directory / "data"
        self.port = free_port()
        self.database = database
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        binary = shutil.which(command[0]) or shutil.which(
            command[0], path="/usr/lib/postgresql/15/bin:/usr/local/bin"
        )
        if binary is None:
            pytest.skip(f"needs PostgreSQL's {command[0]}")
        run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*run_as, binary, *command[1:]],
            check=True,
            capture_output=True,
            timeout=STARTUP_SECONDS * 2,
        )

    def create(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        self.start()
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "pg.log"),
                  "-o", options, "-w", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: "immediate" is a crash, recovered at the next start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self._dsn(self.database))


class PrivatePgBouncer(_ServerProcess):
    """PgBouncer (Debian's package) on a port of its own, in front of this machine's
    PostgreSQL, pooling in ``pool_mode`` with at most ``pool_size`` server connections
    per database: every client's transactions share them, as on a deployment where
    web nodes and workers multiply."""

    def __init__(self, directory: Path, *, pool_mode: str = "transaction", pool_size: int = 4):
        self.directory = directory
        self.port = free_port()
        self.pool_mode = pool_mode
        self.pool_size = pool_size

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
        if binary is None:
            pytest.skip("needs pgbouncer (apt-get install pgbouncer; .ci/run installs it)")
        self.directory.chmod(0o755)  # PgBouncer's user reads its files here
        (self.directory / "users.txt").write_text('"postgres" ""\n')
        config = self.directory / "pgbouncer.ini"
        config.write_text(
            "[databases]\n* = host=127.0.0.1 port=5432\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\ndefault_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n" + ("user = postgres\n" if os.geteuid() == 0 else "")
            # PgBouncer refuses to run as root: it becomes Debian's postgres user
        )
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        self._launch([binary, str(config)], "pgbouncer.log")

    def _answers(self) -> bool:
        try:
            with psycopg.connect(
                f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                connect_timeout=1,
            ):
                return True
        except psycopg.Error:
            return False


@contextmanager
def _serving(
    prefix: str, server_in: Callable[[Path], S], up: Callable[[S], None], down: Callable[[S], None]
) -> Iterator[S]:
    """A server in a temporary directory of its own, brought up, and down at the end."""
    # not pytest's tmp_path: PostgreSQL's user must reach it, and a socket path must be short
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        server = server_in(directory)
        up(server)
        try:
            yield server
        finally:
            down(server)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    with _serving("wr-redis-", PrivateRedis, PrivateRedis.start, PrivateRedis.stop) as server:
        yield server


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    with _serving(
        "wr-pg-", PrivatePostgres, PrivatePostgres.create, _stop_unless_stopped
    ) as server:
        yield server


def _stop_unless_stopped(server: PrivatePostgres) -> None:
    with suppress(subprocess.CalledProcessError):  # stopped by the test already
        server.stop()


@contextmanager
def running_pgbouncer(pool_size: int = 4) -> Iterator[PrivatePgBouncer]:
    """PgBouncer in transaction mode, ``pool_size`` server connections a database (the
    tests' and ``make bench``'s ``--pgbouncer``)."""
    in_directory = functools.partial(PrivatePgBouncer, pool_size=pool_size)
    with _serving("wr-pgb-", in_directory, PrivatePgBouncer.start, PrivatePgBouncer.stop) as server:
        yield server


@pytest.fixture
def pgbouncer() -> Iterator[PrivatePgBouncer]:
    with running_pgbouncer() as server:
        yield server
