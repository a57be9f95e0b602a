"""Read-only admin: the receive path's records are evidence, not data to edit.

Failed events are the exception that proves the rule: still read-only, but with two
actions, replay and discard, each behind a permission of its own and each going through
its service, which records who did it and when.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import FailedEvent, WebhookReceipt


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_custom_permission(self, request: HttpRequest, action: str) -> bool:
        """The model's own permission for ``action`` (its Meta.permissions)."""
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def confirmation_page(
        self,
        request: HttpRequest,
        template: str,
        *,
        form: forms.Form,
        note_field: str,
        selected: list[Any],
        action_name: str,
        title: str,
        submit_label: str,
        **extra: Any,
    ) -> TemplateResponse:
        """An action's confirmation page (admin/webhook_receiver/action_confirmation.html):
        the selection, a note, and a form that posts them back to the action."""
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": self.opts,
            "selected": selected,
            "form": form,
            "note_field": form[note_field],
            "submit_label": submit_label,
            "action_name": action_name,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media + form.media,
            **extra,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, template, context)


def trace_url(source: str, event_key: str) -> str:
    """The trace page of one event key: every delivery, the receipt, the effects, the
    failed-event history."""
    query = urlencode({"source": source, "key": event_key})
    return f"{reverse('admin:webhook_receiver_trace')}?{query}"


def trace_link(source: str, event_key: str) -> str:
    if not event_key:
        return "-"
    return format_html('<a href="{}">trace</a>', trace_url(source, event_key))


class StoredEventDisplay:
    """The stored body, pretty-printed when it is JSON, and the headers, one per line.
    Both are untrusted input: everything goes through format_html."""

    @admin.display(description="body")
    def pretty_body(self, obj: WebhookReceipt | FailedEvent) -> str:
        return _pre(_pretty_json(bytes(obj.body)))

    @admin.display(description="headers")
    def pretty_headers(self, obj: WebhookReceipt | FailedEvent) -> str:
        headers = obj.headers if isinstance(obj.headers, dict) else {}
        return _pre("\n".join(f"{k}: {v}" for k, v in sorted(headers.items())))


def _pre(text: str) -> str:
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def _pretty_json(raw: bytes) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        return raw.decode("utf-8", "replace")
