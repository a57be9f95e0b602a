"""The processes of a run and everything they need, started and always cleaned up.

A database of the run's own (``webhook_multinode_<pid>``) on the shared PostgreSQL at
127.0.0.1:5432, created, migrated and dropped; a Redis of its own (``PrivateRedis``, on
a port of its own: broker on db 0, cache on db 1); one PgBouncer in transaction mode
(``PrivatePgBouncer``) in front of that PostgreSQL. Then two gunicorn "nodes" serving
``project.wsgi``, two relays (``manage.py webhook_relay``), a Celery worker, each a
process group with an environment of its own (its own scratch directory, metrics
directory and node name), and one beat (as a deployment runs exactly one). Every
process reaches the database through the pooler; the relays, which no notification
reaches through it, find the messages at their poll.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from tests.bench.common import SHOP_SECRET
from tests.bench.server import BASE_DIR, GunicornServer, LoggedProcess
from tests.support.private_servers import PrivatePgBouncer, PrivateRedis

POSTGRES = "host=127.0.0.1 port=5432 user=postgres"
SETTINGS = "tests.multinode.settings"
# encrypts the destination's secret at rest (any Fernet key; this run's only)
FERNET_KEY = "mZ1g2dDqXmNaeqvnkZ3fh_J4ivXq9RZJPRnNvFyAFqs="
MERCHANT_SECRET = SHOP_SECRET


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")


def postgres_answers() -> bool:
    try:
        with psycopg.connect(f"{POSTGRES} dbname=postgres", connect_timeout=2):
            return True
    except psycopg.Error:
        return False


class Node(GunicornServer):
    """One web node: ``project.wsgi`` under gunicorn with ``workers`` sync workers."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: int) -> None:
        super().__init__(env, log_path)
        self.workers = workers
        self.name = f"gunicorn node on port {self.port}"

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--workers") + 1] = str(self.workers)
        return command


class Worker(LoggedProcess):
    """``celery -A project worker``, prefork with ``concurrency`` children."""

    startup_timeout = 60

    def __init__(self, env: dict[str, str], log_path: Path, name: str, concurrency: int):
        super().__init__(env, log_path)
        self.name = name
        self.concurrency = concurrency

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "celery", "-A", "project", "worker"]
        command += ["--pool", "prefork", "--concurrency", str(self.concurrency)]
        command += ["--hostname", f"{self.name}@%h", "--without-mingle", "--without-gossip"]
        return command + ["--loglevel", "INFO"]

    def ready(self) -> bool:
        return " ready." in self.log_path.read_text(errors="replace")


class Relay(LoggedProcess):
    """``manage.py webhook_relay``; ready once its heartbeat is in the database."""

    startup_timeout = 60

    def __init__(self, env: dict[str, str], log_path: Path, name: str, database: str) -> None:
        super().__init__(env, log_path)
        self.name = name
        self.database = database

    def command(self) -> list[str]:
        return [sys.executable, "manage.py", "webhook_relay"]

    def ready(self) -> bool:
        if self.process is None:
            return False
        try:
            with psycopg.connect(f"{POSTGRES} dbname={self.database}", connect_timeout=2) as conn:
                found = conn.execute(
                    "SELECT 1 FROM webhook_receiver_heartbeat WHERE name LIKE %s",
                    [f"relay % {self.process.pid}"],
                ).fetchone()
        except psycopg.Error:
            return False
        return found is not None


class Beat(LoggedProcess):
    """``celery -A project beat``: the failed events' retries, the watch's tasks."""

    name = "beat"

    def __init__(self, env: dict[str, str], log_path: Path, schedule: Path) -> None:
        super().__init__(env, log_path)
        self.schedule = schedule

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "celery", "-A", "project", "beat"]
        return command + ["--schedule", str(self.schedule), "--loglevel", "INFO"]

    def ready(self) -> bool:
        return "maxinterval" in self.log_path.read_text(errors="replace")  # its banner, printed


def stop(process: LoggedProcess) -> None:
    """Stop it (SIGTERM, then SIGKILL to its group), and then anything left of its group:
    a child that outlived its parent is still ours to end."""
    pid = process.process.pid if process.process is not None else None
    process.stop()
    if pid is not None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


@dataclass
class Layout:
    """What to start: nodes and their gunicorn workers, relays, Celery workers and their
    children."""

    nodes: int = 2
    web_workers: int = 2
    relays: int = 2
    workers: int = 1
    worker_concurrency: int = 2
    pool_size: int = 8  # PgBouncer's default_pool_size: server connections a database
    beat: bool = True


@dataclass
class Cluster:
    """A run's servers and processes (a context manager: everything stops on exit)."""

    layout: Layout = field(default_factory=Layout)
    keep_logs: Path | None = None
    database: str = field(default_factory=lambda: f"webhook_multinode_{os.getpid()}")
    nodes: list[Node] = field(default_factory=list)
    relays: list[Relay] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    beat: Beat | None = None
    timings: dict[str, float] = field(default_factory=dict)
    own_backends: set[int] = field(default_factory=set)  # the checks' and samplers'

    def __enter__(self) -> Cluster:
        self._stack = ExitStack()
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # --- start-up --------------------------------------------------------------------

    def _start(self) -> None:
        began = time.monotonic()
        self.scratch = Path(tempfile.mkdtemp(prefix="wr-multinode-"))
        self.scratch.chmod(0o755)  # PgBouncer runs as postgres under root: it must enter
        self._stack.callback(self._scratch_remove)
        self._database_create()
        self._stack.callback(self._database_drop)
        self.redis = PrivateRedis(self._subdir("redis"))
        self.redis.start()
        self._stack.callback(self.redis.stop)
        self.pgbouncer = PrivatePgBouncer(
            self._subdir("pgbouncer"), pool_size=self.layout.pool_size
        )
        self.pgbouncer.start()
        self._stack.callback(self.pgbouncer.stop)
        self.timings["servers_s"] = time.monotonic() - began
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
            cwd=BASE_DIR,
            env=self.environment("migrate"),
            check=True,
            timeout=180,
        )
        self.timings["migrate_s"] = time.monotonic() - began
        # start every process, then wait for them together: start-ups overlap
        processes: list[LoggedProcess] = []
        for n in range(1, self.layout.nodes + 1):
            env = self.environment(f"node{n}")
            node = Node(env, self.scratch / f"node{n}.log", self.layout.web_workers)
            self.nodes.append(node)
            processes.append(node)
        for n in range(1, self.layout.relays + 1):
            name = f"relay{n}"
            relay = Relay(self.environment(name), self.scratch / f"{name}.log", name, self.database)
            self.relays.append(relay)
            processes.append(relay)
        for n in range(1, self.layout.workers + 1):
            name = f"worker{n}"
            env = self.environment(name)
            worker = Worker(env, self.scratch / f"{name}.log", name, self.layout.worker_concurrency)
            self.workers.append(worker)
            processes.append(worker)
        if self.layout.beat:
            env = self.environment("beat")
            self.beat = Beat(env, self.scratch / "beat.log", self.scratch / "beat" / "schedule")
            processes.append(self.beat)
        for process in processes:
            self._stack.callback(stop, process)
            process.launch()
        for process in processes:
            process._wait_ready()
        self.timings["ready_s"] = time.monotonic() - began

    def _subdir(self, name: str) -> Path:
        path = self.scratch / name
        path.mkdir(exist_ok=True)
        path.chmod(0o755)
        return path

    def environment(self, machine: str) -> dict[str, str]:
        """The environment of one "machine": the project's settings read all of it."""
        home = self._subdir(machine)
        metrics = home / "metrics"
        metrics.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GUNICORN_", "CELERY_"))}
        for name in ("DATABASE_URL", "CACHE_URL", "DJANGO_SETTINGS_MODULE", "TEST_DATABASE_NAME"):
            env.pop(name, None)
        redis = f"redis://127.0.0.1:{self.redis.port}"
        env |= {
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "DATABASE_URL": self.pgbouncer.url(self.database),
            "DATABASE_POOL_MODE": "transaction",
            "DATABASE_CONNECT_TIMEOUT": "2",
            "CELERY_BROKER_URL": f"{redis}/0",
            "CACHE_URL": f"{redis}/1",
            "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
            "SHOP_SILENCE_AFTER_SECONDS": "0",
            "WEBHOOK_SECRET_ENCRYPTION_KEYS": FERNET_KEY,
            "DJANGO_SECRET_KEY": "multinode-run-only-secret-key-0123456789-abcdefghij",
            "DEMO_VAR_DIR": str(home),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
            "LOG_LEVEL": "WARNING",
            "WEBHOOK_RETRY_SWEEP_SECONDS": "2",
            # through PgBouncer in transaction mode no notification reaches a relay
            "WEBHOOK_RELAY_LISTEN": "false",
        }
        return env

    # --- the pooler's restart ----------------------------------------------------------

    def pgbouncer_restart(self, down_seconds: float) -> float:
        """Stop PgBouncer (SIGTERM: every client connection is cut), keep it down for
        ``down_seconds``, start it again on the same port; how long it was down."""
        stopped = time.monotonic()
        self.pgbouncer.stop()
        time.sleep(down_seconds)
        self.pgbouncer.start()
        return time.monotonic() - stopped

    # --- the database --------------------------------------------------------------------

    def connect(self) -> psycopg.Connection:
        """Straight to PostgreSQL (not through the pooler): the checks' connection."""
        conn = psycopg.connect(f"{POSTGRES} dbname={self.database}", autocommit=True)
        self.own_backends.add(conn.info.backend_pid)
        return conn

    def _database_create(self) -> None:
        with psycopg.connect(f"{POSTGRES} dbname=postgres", autocommit=True) as conn:
            name = sql.Identifier(self.database)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(name))

    def _database_drop(self) -> None:
        with (
            suppress(psycopg.Error),
            psycopg.connect(f"{POSTGRES} dbname=postgres", autocommit=True) as conn,
        ):
            name = sql.Identifier(self.database)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))

    def _scratch_remove(self) -> None:
        if self.keep_logs is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in self.scratch.rglob("*.log"):
                with suppress(OSError):
                    shutil.copy(log, self.keep_logs / log.name)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def manage(self, *args: str) -> str:
        """A management command, run as an operator would on one of the machines."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=self.environment("operator"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def logs_tail(self) -> str:
        parts = []
        for process in [
            *self.nodes,
            *self.relays,
            *self.workers,
            *([self.beat] if self.beat else []),
        ]:
            parts.append(f"--- {process.name} ---\n{process.log_tail(15)}")
        return "\n".join(parts)
