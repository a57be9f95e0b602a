"""The app's user-facing words are marked for translation: lazily where they are made at
import time (models, choices, admin actions), and the templates render under another
language unchanged while it has no catalog (English then)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import models
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.functional import Promise

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


@pytest.mark.parametrize("language", ["de", "fr"])
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
