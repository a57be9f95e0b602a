"""The Celery relay's two task names, kept registered for one release after the relay
became a process of its own: a queued or scheduled call says once, per name, that it
does nothing and what to do, and never sends anything."""

from __future__ import annotations

import logging

from webhook_receiver import tasks


def test_each_gone_task_says_once_that_it_does_nothing(caplog):
    tasks._relay_task_said.clear()
    with caplog.at_level(logging.WARNING, logger="webhook_receiver.tasks"):
        for _ in range(3):
            tasks.relay_destination_task(42)
            tasks.relay_sweep_task()
    lines = [r.getMessage() for r in caplog.records if r.name == "webhook_receiver.tasks"]
    assert len(lines) == 2
    assert lines[0].startswith("webhook_receiver.relay_destination does nothing since 0.2")
    assert lines[1].startswith("webhook_receiver.relay_sweep does nothing since 0.2")
    assert all("manage.py webhook_relay" in line for line in lines)
