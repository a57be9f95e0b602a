"""The run's servers and processes: a PostgreSQL cluster and a Redis of its own
(``tests/support/private_servers.py``, on free ports, in a temporary directory), gunicorn
with the shipped ``deploy/gunicorn.conf.py``, the outbox relay (``manage.py
webhook_relay``), a Celery worker, Celery beat, and the sender. Each process runs in a
session of its own (a SIGKILL to its group reaches its children), its output in a log
of the run's directory; ``stop_all`` ends every one of them, whatever ended the run.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from tests.bench.server import free_port, log_tail, wait_until_ready
from tests.support.paths import REPO

STARTUP_SECONDS = 60
STOP_SECONDS = 15
# the Celery worker's prefork processes (the inbound retries, beat's tasks)
WORKER_PROCESSES = 2


class Service:
    """One command in a session of its own, its output appended to ``log``."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.command, self.env, self.log = name, command, env, log
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, cwd=REPO, env=self.env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started_at = time.time()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, ready, seconds: float = STARTUP_SECONDS) -> float:
        """Wait until ``ready()``; return the seconds it took. Fails with the log's tail."""
        wait_until_ready(self.name, self.process, ready, seconds, self.log)
        return time.time() - self.started_at

    def kill(self) -> None:
        """SIGKILL to the whole group (a worker's pool children too)."""
        if self.process is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_SECONDS)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the group if it has not ended in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
                # a stopped process (the frozen-relay fault) acts on it once continued
                os.killpg(self.process.pid, signal.SIGCONT)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_SECONDS)
        with suppress(ProcessLookupError):  # whatever of the group is left
            os.killpg(self.process.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_SECONDS)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)


def children(pid: int) -> list[int]:
    """The direct children of a process (gunicorn's workers, for its master)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def cpu_ticks(pid: int) -> int:
    """User and system CPU ticks a process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


class Gunicorn(Service):
    def __init__(
        self, env: dict[str, str], log: Path, workers: int, name: str = "gunicorn"
    ) -> None:
        self.port = free_port()
        self.workers = workers
        env = {**env, "GUNICORN_BIND": f"127.0.0.1:{self.port}", "WEB_CONCURRENCY": str(workers)}
        command = [sys.executable, "-m", "gunicorn", "project.wsgi"]
        command += ["-c", str(REPO / "deploy" / "gunicorn.conf.py")]
        super().__init__(name, command, env, log)
        self.url = f"http://127.0.0.1:{self.port}/webhooks/shop/"

    def answers(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/webhooks/shop/")  # any answer (405) means it serves
            conn.getresponse().read()
            return len(children(self.pid)) >= self.workers
        except OSError:
            return False
        finally:
            conn.close()

    def worker_pids(self) -> list[int]:
        return children(self.pid)


class CeleryWorker(Service):
    def __init__(self, env: dict[str, str], log: Path, number: int) -> None:
        command = [sys.executable, "-m", "celery", "-A", "project", "worker"]
        command += ["--pool", "prefork", "--concurrency", str(WORKER_PROCESSES)]
        command += ["--loglevel", "INFO"]
        command += ["--hostname", f"chaos{number}@%h", "--without-mingle", "--without-gossip"]
        super().__init__(f"celery worker {number}", command, env, log)

    def ready(self) -> bool:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return False
        # this start's "ready." line: the log is shared by the worker's restarts
        return text.count(" ready.") >= self.generation

    generation = 1


class RelayProcess(Service):
    def __init__(self, env: dict[str, str], log: Path, number: int) -> None:
        command = [sys.executable, "manage.py", "webhook_relay"]
        super().__init__(f"relay {number}", command, env, log)
        self.generation = number

    def ready(self) -> bool:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return False
        return "relay started" in text


class CeleryBeat(Service):
    def __init__(self, env: dict[str, str], log: Path, schedule: Path) -> None:
        command = [sys.executable, "-m", "celery", "-A", "project", "beat"]
        command += ["--loglevel", "INFO", "--schedule", str(schedule)]
        super().__init__("celery beat", command, env, log)

    def ready(self) -> bool:
        try:
            return "beat: Starting" in self.log.read_text(errors="replace")
        except OSError:
            return False
