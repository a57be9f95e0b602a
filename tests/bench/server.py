"""The bench database and the gunicorn server under test."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self

import environ
import psycopg
from psycopg import sql

from .common import BARE_PATH, FLOOR_DDL

BASE_DIR = Path(__file__).resolve().parents[2]
RESULTS_DIR = BASE_DIR / "bench-results"
HOST = "127.0.0.1"
# The set-up under test, the same for all three endpoints: 2 sync workers, as on a
# 2-core host. Access logging stays off (gunicorn's default) to time the app, not logs.
GUNICORN_WORKERS = 2
# the command that serves project.wsgi; each server adds its own options
GUNICORN_WSGI = (sys.executable, "-m", "gunicorn", "project.wsgi")
STARTUP_TIMEOUT_SECONDS = 30
STOP_TIMEOUT_SECONDS = 15


def bench_env(database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GUNICORN_CMD_ARGS", None)  # nothing outside this file shapes the server
    env["DJANGO_SETTINGS_MODULE"] = "tests.bench.settings"
    env["BENCH_DATABASE_URL"] = database_url
    # the metrics' multiprocess mode, as deploy/gunicorn.conf.py sets it in production
    env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="webhook-bench-metrics-")
    return env


# --- database ------------------------------------------------------------------------


def _connect(database_url: str, dbname: str | None = None) -> psycopg.Connection:
    config = environ.Env.db_url_config(database_url)
    return psycopg.connect(
        host=config.get("HOST") or None,
        port=config.get("PORT") or None,
        user=config.get("USER") or None,
        password=config.get("PASSWORD") or None,
        dbname=dbname or config["NAME"],
        autocommit=True,
    )


def database_analyze(database_url: str) -> None:
    """Statistics, as autovacuum would have gathered them by now (this machine runs
    PostgreSQL without autovacuum); ANALYZE also invalidates the plans already cached."""
    with _connect(database_url) as conn:
        conn.execute("ANALYZE")


def database_recreate(database_url: str) -> None:
    """Drop and create the bench database, so every run starts from empty tables."""
    name = sql.Identifier(environ.Env.db_url_config(database_url)["NAME"])
    with _connect(database_url, dbname="postgres") as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))


def database_migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=BASE_DIR,
        env=env,
        check=True,
    )


def database_prepare(database_url: str) -> dict[str, str]:
    """A fresh, migrated bench database; the environment a server or worker runs in."""
    env = bench_env(database_url)
    print("preparing the bench database ...", flush=True)
    database_recreate(database_url)
    database_migrate(env)
    return env


def floor_tables_create(database_url: str) -> None:
    with _connect(database_url) as conn:
        for statement in FLOOR_DDL:
            conn.execute(statement)


# --- gunicorn ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def log_tail(log: Path, lines: int) -> str:
    """The last ``lines`` lines of a process's log: what says why it failed."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_until_ready(
    name: str,
    process: subprocess.Popen[bytes] | None,
    ready: Callable[[], bool],
    seconds: float,
    log: Path,
) -> None:
    """Wait until ``ready()``; fail, with the log's tail, if the process exits first or
    ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is None or process.poll() is not None:
            raise RuntimeError(f"{name} exited at start-up:\n{log_tail(log, 40)}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} was not ready in {seconds} s:\n{log_tail(log, 40)}")


class LoggedProcess:
    """A command run for a bench in a session of its own (a Ctrl-C reaches the runner,
    which stops it itself), its output in a log: started on enter and waited for until
    ``ready()``, stopped on exit whatever ended the run (SIGTERM, then SIGKILL to the
    group it started if it hangs)."""

    name = "the process"
    startup_timeout = STARTUP_TIMEOUT_SECONDS
    stop_timeout = STOP_TIMEOUT_SECONDS

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def launch(self) -> None:
        """Start it, its output in its log, without waiting for it to be ready."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=BASE_DIR,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.launch()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        wait_until_ready(self.name, self.process, self.ready, self.startup_timeout, self.log_path)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group this process started
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)


class GunicornServer(LoggedProcess):
    """``project.wsgi`` under gunicorn (SIGTERM: the master stops its workers)."""

    name = "gunicorn"

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, log_path)
        self.host = HOST
        self.port = free_port()

    def command(self) -> list[str]:
        return [
            *GUNICORN_WSGI,
            "--workers",
            str(GUNICORN_WORKERS),
            "--worker-class",
            "sync",
            "--bind",
            f"{self.host}:{self.port}",
            "--log-level",
            "warning",
        ]

    def ready(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
        try:
            conn.request("GET", BARE_PATH)  # any HTTP answer (a 405 here) means it serves
            conn.getresponse().read()
            return True
        except OSError:
            return False
        finally:
            conn.close()


# --- the runners' shared odds and ends ------------------------------------------------


def git_commit() -> str:
    """The code measured (with "+dirty" if the work tree has changes): figures age."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=BASE_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the runner's clean-up like a Ctrl-C
