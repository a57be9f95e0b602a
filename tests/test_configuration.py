"""Configuration errors: settings the system checks refuse."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.settings import WEBHOOK_RECEIVER

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("key", ["PURGE_BATCH_SIZE", "AUDIT_RETENTION_DAYS"])
def test_a_non_positive_retention_knob_is_a_configuration_error(key):
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, key: 0}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert key in errors[0].msg


def test_an_unknown_duplicate_check_is_a_configuration_error():
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "DUPLICATE_CHECK": "sometimes"}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert "DUPLICATE_CHECK" in errors[0].msg


def test_an_sqlite_without_returning_is_a_configuration_error(monkeypatch):
    """The relay claims and records with UPDATE … RETURNING (SQLite 3.35)."""
    import sqlite3

    from webhook_receiver.checks import database_problems

    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    old = database_problems(databases)
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 35, 0))
    new = database_problems(databases)

    assert [e.id for e in old] == ["webhook_receiver.E007"]
    assert "3.34.1" in old[0].msg and "3.35" in old[0].msg
    assert new == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DISABLE_AFTER_FAILING_DAYS", -1),
        ("DISABLE_AFTER_FAILING_DAYS", "five"),
        ("DISABLE_AFTER_FAILING_DAYS", True),
        ("DISABLE_WARNING_FRACTION", 0),
        ("DISABLE_WARNING_FRACTION", 1),
        ("DISABLE_WARNING_FRACTION", "half"),
    ],
)
def test_a_retirement_setting_out_of_range_is_a_configuration_error(key, value):
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, key: value}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert key in errors[0].msg


def test_the_retirement_settings_default_to_five_days_warned_at_half():
    from datetime import timedelta

    from webhook_receiver.conf import app_settings

    settings = app_settings()
    assert settings.disable_after_failing == timedelta(days=5)
    assert settings.disable_warning_fraction == 0.5
    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "DISABLE_AFTER_FAILING_DAYS": 0}):
        assert app_settings().disable_after_failing is None
