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
