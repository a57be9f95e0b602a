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


def test_the_removed_claim_mode_setting_is_refused_naming_what_replaces_it():
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "DUPLICATE_CHECK": "adaptive"}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert "DUPLICATE_CHECK" in errors[0].msg
    assert "starts with the claim" in errors[0].msg


def test_the_old_name_of_the_encryption_keys_is_refused_naming_the_new_one():
    from django.core.checks import run_checks

    keys = WEBHOOK_RECEIVER["SECRET_ENCRYPTION_KEYS"]
    old_name = {**WEBHOOK_RECEIVER, "DESTINATION_SECRET_KEYS": keys}
    with override_settings(WEBHOOK_RECEIVER=old_name):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert "WEBHOOK_RECEIVER['DESTINATION_SECRET_KEYS'] has been removed" in errors[0].msg
    assert "renamed SECRET_ENCRYPTION_KEYS" in errors[0].msg


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


# --- the keys' declarations ----------------------------------------------------------------


def declared_classes():
    from webhook_receiver.conf import AppSettings
    from webhook_receiver.conf.sources import ActiveHours, ReconcileConfig, SourceConfig

    return (AppSettings, SourceConfig, ReconcileConfig, ActiveHours)


def test_each_key_is_spelled_once_under_conf():
    """A key's name, default, bounds and meaning live in its declaration alone."""
    import ast
    from collections import Counter
    from pathlib import Path

    import webhook_receiver.conf
    from webhook_receiver.conf.keys import declared

    strings = Counter(
        node.value
        for path in Path(webhook_receiver.conf.__file__).parent.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )
    names = [k.name for cls in declared_classes() for k in declared(cls).values()]
    assert len(names) > 40
    assert {name: strings[name] for name in names if strings[name] != 1} == {}


def test_no_removed_key_is_still_declared():
    from webhook_receiver.conf import REMOVED_KEYS, AppSettings
    from webhook_receiver.conf.keys import declared
    from webhook_receiver.conf.sources import REMOVED_SOURCE_KEYS, SourceConfig

    for removed, cls in ((REMOVED_KEYS, AppSettings), (REMOVED_SOURCE_KEYS, SourceConfig)):
        assert set(removed).isdisjoint(k.name for k in declared(cls).values())


def e001(config):
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER=config):
        return [e.msg for e in run_checks() if e.id == "webhook_receiver.E001"]


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("RETRY_SCHEDULE", "RETRY_BASE_DELAY_SECONDS and RETRY_MAX_DELAY_SECONDS"),
        ("LEGACY_CLAIM", "nothing: every delivery claims the same way now"),
    ],
)
def test_a_removed_key_is_refused_at_start_naming_what_replaces_it(monkeypatch, name, instead):
    from webhook_receiver import conf

    monkeypatch.setitem(conf.REMOVED_KEYS, name, instead)

    errors = e001({**WEBHOOK_RECEIVER, name: 1})

    assert errors == [
        f"WEBHOOK_RECEIVER[{name!r}] has been removed: {instead}. Remove it from WEBHOOK_RECEIVER."
    ]
    assert e001(WEBHOOK_RECEIVER) == []


def test_a_removed_key_of_a_source_is_refused_naming_the_source(monkeypatch):
    from webhook_receiver.conf import sources

    monkeypatch.setitem(sources.REMOVED_SOURCE_KEYS, "REPLAY_WINDOW", "TOLERANCE_SECONDS")
    shop = {**WEBHOOK_RECEIVER["SOURCES"]["shop"], "REPLAY_WINDOW": 300}

    errors = e001({**WEBHOOK_RECEIVER, "SOURCES": {"shop": shop}})

    assert len(errors) == 1
    assert errors[0].startswith(
        "WEBHOOK_RECEIVER['SOURCES']['shop']['REPLAY_WINDOW'] has been removed: TOLERANCE_SECONDS."
    )


@pytest.mark.parametrize(
    ("where", "config"),
    [
        ("WEBHOOK_RECEIVER", {"RETRY_ATTEMPTS": 3}),
        ("WEBHOOK_RECEIVER['SOURCES']['shop']", {"SOURCES": {"shop": {"SECRET": "x"}}}),
        (
            "WEBHOOK_RECEIVER['SOURCES']['shop']['RECONCILE']",
            {"SOURCES": {"shop": {"SECRETS": "x", "RECONCILE": {"URL": "x"}}}},
        ),
        (
            "WEBHOOK_RECEIVER['SOURCES']['shop']['ACTIVE_HOURS']",
            {"SOURCES": {"shop": {"SECRETS": "x", "ACTIVE_HOURS": {"FROM": "08:00"}}}},
        ),
    ],
)
def test_an_unknown_key_is_refused_where_it_is(where, config):
    errors = e001({**WEBHOOK_RECEIVER, **config})

    assert len(errors) == 1
    assert errors[0].startswith(f"{where} has unknown keys: ")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("LOCK_TIMEOUT_MS", -1, "must be a whole number of milliseconds, 0 for no limit."),
        ("REJECTED_AUDIT_PER_MINUTE", "ten", "must be a number of at least 1, not 'ten'."),
        ("AUDIT_RETENTION_DAYS", "30", "unsupported type for timedelta days component: str"),
        ("HANDLERS", 5, "object is not iterable"),
    ],
)
def test_a_bad_value_names_its_key(key, value, message):
    errors = e001({**WEBHOOK_RECEIVER, key: value})

    assert len(errors) == 1
    assert errors[0].startswith(f"WEBHOOK_RECEIVER[{key!r}]")
    assert message in errors[0]


@pytest.mark.parametrize(
    ("reconcile", "message"),
    [
        ({"GRACE_SECONDS": 7200}, "['RECONCILE']: GRACE_SECONDS must be shorter than LOOKBACK"),
        ({"MARGIN_SECONDS": 1.5}, "['RECONCILE']['MARGIN_SECONDS'] must be whole seconds"),
    ],
)
def test_a_reconciliation_window_out_of_bounds_names_its_key(reconcile, message):
    shop = {**WEBHOOK_RECEIVER["SOURCES"]["shop"], "RECONCILE": {"ADAPTER": "file", **reconcile}}

    errors = e001({**WEBHOOK_RECEIVER, "SOURCES": {"shop": shop}})

    assert len(errors) == 1
    assert message in errors[0]


def test_the_settings_object_reads_every_declared_default():
    from webhook_receiver.conf import AppSettings, app_settings
    from webhook_receiver.conf.keys import declared

    with override_settings(WEBHOOK_RECEIVER={}):
        config = app_settings()
        assert config.lock_timeout_ms == 2000
        assert config.receipt_retention.days == 35
        assert config.notifiers == ("log", "signal")
        assert "authorization" in config.redacted_headers
        assert "stripe-signature" in config.signature_headers
    assert set(declared(AppSettings)) == {
        f for f in AppSettings.__dataclass_fields__ if f != "signature_headers"
    }


def test_the_settings_objects_never_show_a_secret_in_their_repr(settings):
    from webhook_receiver.conf import app_settings

    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "METRICS_TOKEN": "metrics-token-not-to-be-shown-0123456789",
        "SOURCES": {"acme": {"SECRETS": ["whsec_source_secret_not_to_be_shown_0123"]}},
    }

    shown = repr(app_settings())

    assert "metrics-token-not-to-be-shown" not in shown
    assert "source_secret_not_to_be_shown" not in shown
    assert "secret_encryption_keys" not in shown
    assert "lock_timeout_ms=2000" in shown  # the rest still shows
