"""Read-only admin: the receive path's records are evidence, not data to edit.

Failed events are the exception that proves the rule: still read-only, but with two
actions, replay and discard, each behind a permission of its own and each going through
its service, which records who did it and when.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core import storable
from ..inbound.models import FailedEvent, WebhookReceipt
from ..presentation import display
from .cells import pre

# The mixins below are model admins' (they call its methods and override its views): the
# checker sees ModelAdmin as their base; at run time it is object, as a mixin's
if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    _ModelAdminMixin = admin.ModelAdmin[Any]
else:
    _ModelAdminMixin = object


def visible_response(response: HttpResponse) -> HttpResponse:
    """``response`` with every invisible character its page shows escaped
    (display.visible_html), once it is rendered; anything but an HTML page as it is."""
    if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
        response.add_post_render_callback(_visible_content)
    elif response.get("Content-Type", "").startswith("text/html") and not response.streaming:
        _visible_content(response)
    return response


def _visible_content(response: HttpResponse) -> None:
    page = response.content.decode(response.charset)
    shown = display.visible_html(page)
    if shown is not page:
        response.content = shown.encode(response.charset)


class VisibleText(_ModelAdminMixin):
    """Every page of a model admin (list, actions and their confirmation pages, detail,
    history, delete) passed through visible_response: what peers sent is shown with its
    bidirectional controls and invisible characters as escapes, whichever field, filter,
    title or message carries it."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return visible_response(super().changelist_view(request, extra_context))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        return visible_response(
            super().changeform_view(request, object_id, form_url, extra_context)
        )

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        return visible_response(super().history_view(request, object_id, extra_context))

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        return visible_response(super().delete_view(request, object_id, extra_context))


def custom_permission(action: str) -> Callable[[Any, HttpRequest], bool]:
    """A ``has_<action>_permission`` method, which ``@admin.action(permissions=[action])``
    asks: the model's own permission for the action (its Meta.permissions)."""

    def has_permission(model_admin: Any, request: HttpRequest) -> bool:
        return model_admin.has_custom_permission(request, action)

    return has_permission


class ReadOnlyAdmin(VisibleText, admin.ModelAdmin):
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


@dataclass(frozen=True)
class ObjectButton:
    """A button on one object's page that runs a list action on that object alone."""

    # the list action's method: (request, one-row queryset) -> a confirmation page, or
    # None once it has acted
    method: str
    # the statuses it applies to (None: an object without one, any object), and the
    # past participle for "cannot be …"
    statuses: tuple[str, ...] | None
    done: StrOrPromise
    # the button's words, and "go" (it sends or runs something) or "stop" (it gives up)
    label: StrOrPromise
    tone: str = "go"

    def applies_to(self, obj: Any) -> bool:
        return self.statuses is None or obj.status in self.statuses


class ObjectButtons(_ModelAdminMixin):
    """Buttons on an object's own page (Replay, Discard, Retry now…) that run the list's
    own actions on that one object: the same permission (the button's name is the
    action of a Meta permission), the same confirmation page, the same service.

    The change form's template (admin/webhook_receiver/change_form.html) gets
    ``object_buttons``, the (name, button, url) of each button the user may press on this
    object; ``button_context`` adds more (``trace_url``, a Trace button).
    """

    object_buttons: dict[str, ObjectButton] = {}
    if TYPE_CHECKING:
        # the host's (ReadOnlyAdmin's, or the model admin's own)
        def has_custom_permission(self, request: HttpRequest, action: str) -> bool: ...

    # "event", "message": in the warning for a button pressed on the wrong status
    object_noun = _("object")

    def get_urls(self) -> list[URLPattern]:
        buttons = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(functools.partial(self.object_button_view, name=name)),
                name=self._url_name(name),
            )
            for name in self.object_buttons
        ]
        return [*buttons, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        buttons: dict[str, Any] = {}
        if obj is not None:
            buttons["object_buttons"] = [
                (name, button, self.object_url(name, obj))
                for name, button in self.object_buttons.items()
                if button.applies_to(obj) and self.has_custom_permission(request, name)
            ]
            buttons.update(self.button_context(request, obj))
        return super().change_view(
            request, object_id, form_url, extra_context={**(extra_context or {}), **buttons}
        )

    def button_context(self, request: HttpRequest, obj: Any) -> dict[str, Any]:
        return {}

    def object_status_text(self, obj: Any) -> str:
        return obj.get_status_display()

    def object_url(self, name: str, obj: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self._url_name(name)}", args=[quote(obj.pk)])

    def _url_name(self, name: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{name}"

    def object_button_view(
        self, request: HttpRequest, object_id: str, *, name: str
    ) -> HttpResponse:
        button = self.object_buttons[name]
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"No {self.object_noun} with that id.")
        if not (
            self.has_view_permission(request, obj) and self.has_custom_permission(request, name)
        ):
            raise PermissionDenied
        if not button.applies_to(obj):
            text = gettext("A %(status)s %(noun)s cannot be %(done)s.") % {
                "status": self.object_status_text(obj).lower(),
                "noun": self.object_noun,
                "done": button.done,
            }
            self.message_user(request, text, messages.WARNING)
            return HttpResponseRedirect(self.object_url("change", obj))
        selection = self.get_queryset(request).filter(pk=obj.pk)
        response = getattr(self, button.method)(request, selection)
        if response is None:
            return HttpResponseRedirect(self.object_url("change", obj))
        return visible_response(response)


class StoredEventDisplay:
    """The stored body, pretty-printed when it is JSON, and the headers, one per line.
    Both are untrusted input: everything goes through format_html. Signature headers
    are shown redacted whatever a row stored (REDACTED_HEADERS, KEEP_SIGNATURE_HEADERS)."""

    # what identifies a stored event, first on its page
    event_fields = ("source", "event_key", "event_type", "message_id", "signature_timestamp")

    @admin.display(description=_("body"))
    def pretty_body(self, obj: WebhookReceipt | FailedEvent) -> str:
        return pre(display.body_text(bytes(obj.body)))

    @admin.display(description=_("headers"))
    def pretty_headers(self, obj: WebhookReceipt | FailedEvent) -> str:
        headers = obj.headers if isinstance(obj.headers, dict) else {}
        shown = storable.shown_headers(headers)
        return pre("\n".join(f"{k}: {v}" for k, v in sorted(shown.items())))


# --- list cells ---------------------------------------------------------------------------


# --- times, as the lists and detail pages show them ---------------------------------------
