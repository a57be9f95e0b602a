"""The example Prometheus alerting rules shipped in deploy/prometheus/: they use only
metrics /metrics/ exposes, they are valid YAML, and (with promtool) the outbox's alerts
fire when deploy/prometheus/alerts_test.yml says they should."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import REPO

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"


def test_the_example_alerts_use_only_metrics_that_exist():
    text = ALERTS.read_text()
    used = set(re.findall(r"webhook_receiver_[a-z_]+", text))
    exposed = {
        "webhook_receiver_events_total",
        "webhook_receiver_rejected_total",
        "webhook_receiver_receive_seconds_bucket",
        "webhook_receiver_failed_events",
        "webhook_receiver_oldest_retry_age_seconds",
        "webhook_receiver_retries_stalled",
        "webhook_receiver_last_event_timestamp_seconds",
        "webhook_receiver_silence_alert_open",
        "webhook_receiver_repair_items_open",
        "webhook_receiver_outbox_breaker_open",
        "webhook_receiver_outbox_failed",
        "webhook_receiver_outbox_oldest_eligible_age_seconds",
        "webhook_receiver_outbox_not_sending",
    }
    assert used <= exposed, used - exposed
    assert {
        "webhook_receiver_silence_alert_open",
        "webhook_receiver_last_event_timestamp_seconds",
        "webhook_receiver_failed_events",
        "webhook_receiver_retries_stalled",
        "webhook_receiver_repair_items_open",
        "webhook_receiver_rejected_total",
        "webhook_receiver_outbox_breaker_open",
        "webhook_receiver_outbox_failed",
        "webhook_receiver_outbox_oldest_eligible_age_seconds",
        "webhook_receiver_outbox_not_sending",
    } <= used


def test_the_example_alerts_are_valid_yaml():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")

    document = yaml.safe_load(ALERTS.read_text())

    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert rules
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule)


def test_the_outbox_alerts_fire_when_they_should():
    """deploy/prometheus/alerts_test.yml, with Prometheus' own rule tester."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package)")
    result = subprocess.run(
        [promtool, "test", "rules", str(ALERTS.with_name("alerts_test.yml"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
