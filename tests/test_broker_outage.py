"""A broker outage, on real processes: Celery beat and a Celery worker of the demo project
(its settings, its logging) against a Redis of the test's own, which is stopped and then
started again.

- Each process writes one line when the outage starts and one when the broker answers
  again (webhook_receiver.core.broker.BrokerOutageLines), not beat's traceback per
  scheduled task (10,931 lines in a 180 s outage before) or the worker's line per
  reconnection attempt.
- A worker inside a task when Redis restarts keeps running, and runs a task sent after
  the restart (webhook_receiver/core/broker.py: Celery 5.7 ended it with kombu's
  ``AttributeError: 'NoneType' object has no attribute 'hostname'``).

Neither process needs the database: the worker consumes a queue of its own (beat's
tasks wait in Redis), so both engines run it alike.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from project.celery import app
from tests.support.paths import REPO
from tests.support.private_servers import PrivateRedis, private_redis  # noqa: F401 (fixture)
from tests.support.worker import wait_for

OUTAGE_SECONDS = 15.0
QUEUE = "broker-outage-test"
# a timeline line: date, time, level, logger, [pid]
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\w+) (\S+) \[\d+\] (.*)$")


def demo_env(redis: PrivateRedis, var_dir: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CELERY_", "DJANGO_", "DATABASE_", "LOG_", "WEBHOOK_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",  # the demo's logging, not the tests'
        CELERY_BROKER_URL=redis.url,
        DEMO_VAR_DIR=str(var_dir),
        SHOP_WEBHOOK_SECRETS="whsec_broker_outage_test_secret_0123456789",
        WEBHOOK_RETRY_SWEEP_SECONDS="1",  # a scheduled task a second: many failed sends
        PYTHONUNBUFFERED="1",
    )
    return env


@contextmanager
def celery(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", *args],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the pool children end with it
    )
    try:
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def worker_args(app_module: str) -> list[str]:
    # as make chaos starts it: two processes, without mingle and gossip; so a task runs and
    # the consumer's BRPOP for the next is pending when Redis goes, the case that ended
    # the worker (webhook_receiver/core/broker.py)
    return ["-A", app_module, "worker", "--pool", "prefork", "--concurrency", "2",
            "--loglevel", "INFO", "--queues", QUEUE, "--hostname", "outage@%h",
            "--without-mingle", "--without-gossip"]  # fmt: skip


def records(log: Path) -> list[tuple[str, str, str]]:
    """(level, logger, message) of each timeline line of the log."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = RECORD.match(line)
        if match:
            found.append((match[1], match[2], match[3]))
    return found


def outage_lines(log: Path) -> list[str]:
    """The lines that say something of the broker (its loss, its return, a failure)."""
    words = ("broker", "Cannot connect", "Couldn't apply", "Message Error", "Connected to")
    return [
        f"{level} {logger} {message}"
        for level, logger, message in records(log)
        if any(word in message for word in words)
    ]


def seconds(line: str) -> float:
    """The outage's length in a return line."""
    return float(re.search(r"answers again after (\d+\.\d) s", line)[1])


def test_beat_and_the_worker_write_one_line_when_the_broker_goes_and_one_when_it_is_back(
    private_redis: PrivateRedis,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = demo_env(private_redis, tmp_path / "var")
    beat_log, worker_log = tmp_path / "beat.log", tmp_path / "worker.log"
    beat_args = ["-A", "project", "beat", "--loglevel", "INFO",
                 "--schedule", str(tmp_path / "beat-schedule")]  # fmt: skip
    with (
        celery(worker_args("project"), env, worker_log) as worker,
        celery(beat_args, env, beat_log),
    ):
        wait_for(lambda: " ready." in worker_log.read_text(), 60, "the worker to start")
        # beat sends on its schedule, beyond the heartbeat it sends as it starts: its
        # tasks wait in Redis (the worker consumes a queue of its own)
        queued = redis.Redis(port=private_redis.port, socket_timeout=2)
        wait_for(lambda: queued.llen("celery") > 1, 60, "beat's schedule to send a task")
        private_redis.stop()
        time.sleep(OUTAGE_SECONDS)
        private_redis.start()
        wait_for(lambda: "answers again" in beat_log.read_text(), 30, "beat's return line")
        wait_for(lambda: "answers again" in worker_log.read_text(), 60, "the worker's")
        time.sleep(3)  # anything more either would write after its return
        assert worker.poll() is None, worker_log.read_text()[-3000:]

    beat, worker_lines = outage_lines(beat_log), outage_lines(worker_log)
    assert len(beat) == 2, beat
    assert beat[0].startswith("ERROR celery.beat broker not answering: kombu"), beat
    assert beat[1].startswith("INFO celery.beat broker answers again after "), beat
    assert OUTAGE_SECONDS - 3 < seconds(beat[1]) < OUTAGE_SECONDS + 15, beat
    # a scheduled task a second for 15 s (beat backs off between its own retries): some
    # failures, one line
    assert int(re.search(r"\((\d+) more", beat[1])[1]) >= 5, beat
    # the worker: its start-up's "Connected to", then the loss and the return
    assert worker_lines[0].startswith("INFO celery.worker.consumer.connection Connected to")
    assert len(worker_lines) == 3, worker_lines
    assert "Connection to broker lost" in worker_lines[1], worker_lines
    assert re.search(r"Connected to .*: broker answers again after ", worker_lines[2])
    # (it reconnects on Celery's backoff: 2, 4, 6, 8 … s apart)
    assert OUTAGE_SECONDS - 3 < seconds(worker_lines[2]) < OUTAGE_SECONDS + 15, worker_lines
    for log in (beat_log, worker_log):
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    # beat wrote nothing else through the outage but its banner
    assert [r for r in records(beat_log) if r[1] == "celery.beat"] == [
        tuple(line.split(" ", 2)) for line in beat
    ]


def test_a_worker_inside_a_task_keeps_running_through_a_redis_restart(
    private_redis: PrivateRedis,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = demo_env(private_redis, tmp_path / "var")
    log = tmp_path / "worker.log"
    started, done, after = (tmp_path / name for name in ("started", "done", "after"))

    def send(*args: object) -> None:
        with app.connection_for_write(private_redis.url) as connection:
            app.send_task("tests.sleeps", args, queue=QUEUE, connection=connection)

    with celery(worker_args("tests.support.broker_tasks"), env, log) as worker:
        wait_for(lambda: " ready." in log.read_text(), 60, "the worker to start")
        send(20.0, str(started), str(done))  # unacknowledged while it runs (acks_late)
        wait_for(started.exists, 30, "the task to start")
        private_redis.stop()
        time.sleep(3)
        private_redis.start()
        wait_for(lambda: "answers again" in log.read_text(), 60, "the worker to reconnect")
        send(0.0, str(after), str(after))
        wait_for(after.exists, 30, "the task sent after the restart to run")
        assert worker.poll() is None, log.read_text()[-3000:]
    text = log.read_text()
    assert "Unrecoverable error" not in text and "Traceback" not in text, text[-3000:]
