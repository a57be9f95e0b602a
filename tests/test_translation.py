"""The app's user-facing words are marked for translation: lazily where they are made at
import time (models, choices, admin actions), and the templates render under another
language unchanged while it has no catalog (English then)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import models
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.functional import Promise

from webhook_receiver.presentation.display import duration_text
from webhook_receiver.watch.conditions import SOURCE_CONDITIONS

APP = apps.get_app_config("webhook_receiver")
MODELS = list(APP.get_models())


def test_the_app_and_every_model_are_named_in_marked_words():
    assert isinstance(APP.verbose_name, Promise)
    assert len(MODELS) >= 12
    for model in MODELS:
        assert isinstance(model._meta.verbose_name, Promise), model
        assert isinstance(model._meta.verbose_name_plural, Promise), model


def test_every_choice_label_is_marked():
    fields = [
        field
        for model in MODELS
        for field in model._meta.get_fields()
        if isinstance(field, models.Field) and field.choices
    ]
    assert fields
    for field in fields:
        for value, label in field.choices:
            assert isinstance(label, Promise), (field, value)


def test_every_registered_action_of_the_app_has_a_marked_description():
    admins = [
        model_admin
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "webhook_receiver"
    ]
    described = 0
    for model_admin in admins:
        for name in model_admin.actions or ():
            action = getattr(model_admin, name)
            assert isinstance(action.short_description, Promise), (model_admin, name)
            described += 1
    assert described >= 9


@pytest.mark.parametrize("language", ["de", "it"])  # languages the app has no catalog of
def test_a_template_renders_in_english_without_a_catalog(language):
    context = {
        "row": {
            "state": "alert",
            "reasons": [
                {
                    "reason": {"code": "silent", "state": {"label": "alert"}, "text": "quiet"},
                    "link": {"url": "/x/", "text": "show"},
                }
            ],
        },
        "columns": 7,
        "kind": "source",
        "name": "shop",
    }
    english = render_to_string("admin/webhook_receiver/overview_reasons.html", context)
    with translation.override(language):
        other = render_to_string("admin/webhook_receiver/overview_reasons.html", context)
    assert "✖ Alert" in english
    assert other == english


@pytest.mark.parametrize("language", ["en", "de"])
def test_durations_are_worded_through_ngettext_the_same_without_a_catalog(language):
    with translation.override(language):
        shown = [duration_text(timedelta(seconds=s)) for s in (1, 45, 60, 3600, 7500, 273600)]
    assert shown == ["1 s", "45 s", "1 min", "1 h 00 min", "2 h 05 min", "3 d 4 h"]


def test_a_duration_in_a_text_built_at_import_is_lazy():
    (old_retry,) = [c for c in SOURCE_CONDITIONS if c.code == "old_retry"]
    assert isinstance(old_retry.why, Promise)
    assert str(old_retry.why).startswith("an event retrying for over 1 h 00 min: ")
