"""Beat's heartbeat as beat starts: on real processes (the demo's beat and a worker), the
first heartbeat is recorded before beat's schedule sends one, so a new install's status
does not say "beat never seen" through the first interval."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO
from tests.support.worker import celery_env, wait_for
from webhook_receiver.watch.heartbeat import heartbeat_seen_at

SCHEDULED_SEND = "Sending due task beat-heartbeat"


@pytest.mark.postgres_only("a worker and beat of their own, on the test database")
@pytest.mark.django_db(transaction=True)
def test_a_starting_beat_sends_its_heartbeat_before_its_first_interval(workers, tmp_path):
    # given: a worker, and no heartbeat yet
    workers(1)
    assert heartbeat_seen_at() is None
    log = tmp_path / "beat.log"
    command = [sys.executable, "-m", "celery", "-A", "project", "beat", "--loglevel", "INFO"]
    command += ["--schedule", str(tmp_path / "beat-schedule")]

    # when: beat starts
    beat = subprocess.Popen(
        command, cwd=REPO, env=celery_env(), stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: heartbeat_seen_at() is not None, 60, "the first heartbeat")
        # then: it came before beat's schedule sent any (its first is one interval on)
        assert SCHEDULED_SEND not in log.read_text(), log.read_text()
    finally:
        beat.terminate()
        beat.wait(timeout=30)
