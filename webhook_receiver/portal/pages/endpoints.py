"""The endpoints' pages: the list with each one's health, an endpoint's page (health,
subscriptions, limits, and what the session may do to it), add and edit, disable and
enable, its secret (the public keys; a rotation), and a test event.

Every read and write goes through actions.py; a service's
refusal is shown on its form (400). A secret is shown once, in the answer to the POST
that made it: never in a URL, never on a later page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from ...conf import app_settings
from ...outbound.breaker import destination_breaker
from ...outbound.endpoints import offered_catalog
from ...outbound.models import WebhookDestination
from ...presentation.display import duration_text, json_text, local_time, url_masked, visible_html
from .. import actions
from ..access import capability_missing_text
from ..forms import EndpointForm, SecretRotateForm, TestEventForm, group_patterns
from ..guard import PortalRequest, portal_page
from ..models import Capability
from .catalog import catalog_groups

TEMPLATES = "webhook_receiver/portal/"
FORM_METHODS = ["GET", "HEAD", "POST"]

NOTES = {
    "saved": _("Saved."),
    "disabled": _("Disabled: nothing more is sent to it; its messages wait until it is enabled."),
    "already_disabled": _("It was disabled already."),
    "enabled": _("Enabled: its waiting messages are sent, in their order."),
    "already_enabled": _("It was enabled already."),
}


def page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    section: str,
    status: int = 200,
) -> HttpResponse:
    """A portal page: its nav's section, what the session may do (``may``), and every
    invisible character of what merchants' servers said shown as its escape."""
    portal = getattr(request, "portal", None)
    may = {c: portal is not None and portal.may(c) for c in Capability.values}
    full = {"section": section, "may": may, **context}
    response = render(request, TEMPLATES + template, full, status=status)
    response.content = visible_html(response.content.decode()).encode()
    return response


def note_of(request: HttpRequest, notes: dict[str, Any]) -> str:
    """The note a redirect left (a word of ``notes``; never text from the URL)."""
    return str(notes.get(request.GET.get("note", ""), ""))


@dataclass(frozen=True)
class HealthShown:
    """An endpoint's health in words: its state, its breaker (its state, a few words
    for the list and a sentence for its page), and when the relay would retire it."""

    enabled: bool
    state: str
    breaker: str
    breaker_short: str
    breaker_text: str
    retirement: str
    retirement_short: str = ""


def health_of(dest: WebhookDestination, now: datetime | None = None) -> HealthShown:
    now = now or timezone.now()
    breaker = destination_breaker(dest, now=now)
    failures = breaker.consecutive_failures
    short, text = "", ""
    if breaker.state == "open" and breaker.until is not None:
        until = timezone.localtime(breaker.until)
        short = gettext("until %(time)s") % {"time": f"{until:%H:%M:%S}"}
        text = gettext(
            "until %(time)s, after %(failures)d consecutive failures; then one probe decides"
        ) % {"time": local_time(breaker.until), "failures": failures}
    elif breaker.state == "half-open":
        text = gettext("one probe at a time decides whether it closes")
    elif failures:
        text = gettext("%(failures)d consecutive failures; it opens at %(threshold)d") % {
            "failures": failures,
            "threshold": dest.breaker_threshold,
        }
    return HealthShown(
        enabled=dest.enabled,
        state=_state_text(dest),
        breaker=breaker.state,
        breaker_short=short,
        breaker_text=text,
        retirement=_retirement_text(dest, now),
        retirement_short=_retirement_text(dest, now, short=True),
    )


def _state_text(dest: WebhookDestination) -> str:
    if dest.enabled:
        return gettext("enabled")
    since = local_time(dest.disabled_at, gettext("unknown"))
    if dest.disabled_reason:
        return gettext(
            "disabled by the relay since %(time)s: %(reason)s. Its messages wait until it "
            "is enabled."
        ) % {"time": since, "reason": dest.disabled_reason}
    return gettext("disabled since %(time)s. Its messages wait until it is enabled.") % {
        "time": since
    }


def _retirement_text(dest: WebhookDestination, now: datetime, *, short: bool = False) -> str:
    """ "failing since …; retired in N days unless a delivery succeeds" ("" when it is
    not failing); ``short``: the list's few words, "" when there is no countdown."""
    if dest.failing_since is None:
        return ""
    since = local_time(dest.failing_since)
    span = app_settings().disable_after_failing
    if not dest.enabled or not span:
        return "" if short else gettext("failing since %(time)s") % {"time": since}
    left = dest.failing_since + span - now
    if left.total_seconds() <= 0:
        if short:
            return gettext("failing: retired at its next failure")
        return gettext(
            "failing since %(time)s; retired at its next failed delivery unless one succeeds"
        ) % {"time": since}
    if short:
        return gettext("failing: retired in %(left)s") % {"left": duration_text(left)}
    return gettext("failing since %(time)s; retired in %(left)s unless a delivery succeeds") % {
        "time": since,
        "left": duration_text(left),
    }


def _limits(dest: WebhookDestination) -> list[tuple[str, str]]:
    rate = dest.rate_count / dest.rate_seconds if dest.rate_seconds > 0 else 0.0
    return [
        (
            gettext("Rate"),
            gettext("%(count)d per %(seconds)g s (%(rate)g a second), bursts of %(burst)d")
            % {
                "count": dest.rate_count,
                "seconds": dest.rate_seconds,
                "rate": rate,
                "burst": dest.burst,
            },
        ),
        (gettext("In flight at once"), str(dest.max_in_flight)),
        (gettext("Timeout"), gettext("%(seconds)g s") % {"seconds": dest.timeout_seconds}),
        (
            gettext("Attempts"),
            ngettext("%(count)d in all", "%(count)d in all", dest.max_attempts)
            % {"count": dest.max_attempts},
        ),
        (
            gettext("Replay horizon"),
            ngettext("%(count)d day", "%(count)d days", dest.replay_horizon_days)
            % {"count": dest.replay_horizon_days},
        ),
    ]


# --- reading ---------------------------------------------------------------------------


@portal_page()
@require_safe
def endpoint_list(request: PortalRequest) -> HttpResponse:
    now = timezone.now()
    rows = [
        (e, health_of(e, now), url_masked(e.url))
        for e in actions.endpoints(request.portal).order_by("name")
    ]
    return page(request, "endpoints.html", {"rows": rows}, section="endpoints")


@portal_page()
@require_safe
def endpoint_detail(request: PortalRequest, pk: int) -> HttpResponse:
    found = actions.endpoint(request.portal, pk)
    return _detail(request, found, note=note_of(request, NOTES))


def _detail(
    request: PortalRequest, found: WebhookDestination, *, note: str = "", warning: str = ""
) -> HttpResponse:
    now = timezone.now()
    waiting = getattr(found, "oldest_eligible_at", None)
    context = {
        "endpoint": found,
        "url_shown": url_masked(found.url),
        "health": health_of(found, now),
        "waiting_for": duration_text(now - waiting) if waiting else "",
        "filter_text": "" if found.filter is None else json_text(found.filter),
        "limits": _limits(found),
        "note": note,
        "warning": warning,
    }
    return page(request, "endpoint.html", context, section="endpoints")


# --- add and edit ------------------------------------------------------------------------


@portal_page(Capability.MANAGE_ENDPOINTS)
@require_http_methods(FORM_METHODS)
def endpoint_add(request: PortalRequest) -> HttpResponse:
    if request.method != "POST":
        return _form_page(request, EndpointForm(), None)
    form = EndpointForm(request.POST)
    checked = form.checked() if form.is_valid() else None
    if checked is None:
        return _form_page(request, form, None, status=400)
    fields, warning = checked
    made, secret = actions.endpoint_create(request.portal, fields)
    context = {"endpoint": made, "secret": secret, "warning": warning}
    return page(request, "endpoint_created.html", context, section="endpoints")


@portal_page(Capability.MANAGE_ENDPOINTS)
@require_http_methods(FORM_METHODS)
def endpoint_edit(request: PortalRequest, pk: int) -> HttpResponse:
    found = actions.endpoint(request.portal, pk)
    current = list(found.event_types or [])
    if request.method != "POST":
        form = EndpointForm(initial=EndpointForm.initial_of(found), current=current)
        return _form_page(request, form, found)
    form = EndpointForm(request.POST, current=current)
    checked = form.checked() if form.is_valid() else None
    if checked is None:
        return _form_page(request, form, found, status=400)
    fields, warning = checked
    actions.endpoint_update(request.portal, pk, fields)
    if warning:  # saved; the guard checks the name again before each send
        return _detail(
            request, actions.endpoint(request.portal, pk), note=str(NOTES["saved"]), warning=warning
        )
    return _to_endpoint(pk, "saved")


def _form_page(
    request: PortalRequest,
    form: EndpointForm,
    found: WebhookDestination | None,
    status: int = 200,
) -> HttpResponse:
    selected = form.selected()
    offered = {*group_patterns(), *(e.name for e in offered_catalog())}
    kept = list(found.event_types or []) if found is not None else []
    others = [(value, value in selected) for value in kept if value not in offered]
    context = {
        "form": form,
        "endpoint": found,
        "groups": catalog_groups(selected),
        "others": others,
    }
    return page(request, "endpoint_form.html", context, section="endpoints", status=status)


# --- disable and enable --------------------------------------------------------------------


def _to_endpoint(pk: int, note: str) -> HttpResponse:
    return HttpResponseRedirect(reverse("webhook_portal:endpoint", args=[pk]) + f"?note={note}")


@portal_page(Capability.MANAGE_ENDPOINTS)
@require_POST
def endpoint_disable(request: PortalRequest, pk: int) -> HttpResponse:
    changed = actions.endpoint_enable(request.portal, pk, enabled=False)
    return _to_endpoint(pk, "disabled" if changed else "already_disabled")


@portal_page(Capability.MANAGE_ENDPOINTS)
@require_POST
def endpoint_enable(request: PortalRequest, pk: int) -> HttpResponse:
    changed = actions.endpoint_enable(request.portal, pk, enabled=True)
    return _to_endpoint(pk, "enabled" if changed else "already_enabled")


# --- the secret --------------------------------------------------------------------------


@portal_page()
@require_http_methods(FORM_METHODS)
def endpoint_secret(request: PortalRequest, pk: int) -> HttpResponse:
    """GET: how many secrets sign and the public keys (view_secret), and the rotation's
    form (manage_secret). POST: rotate (manage_secret), and show the new secret once."""
    portal = request.portal
    if not (portal.may(Capability.VIEW_SECRET) or portal.may(Capability.MANAGE_SECRET)):
        raise PermissionDenied(capability_missing_text(Capability.VIEW_SECRET))
    found = actions.endpoint(portal, pk)
    form = SecretRotateForm(request.POST if request.method == "POST" else None)
    secret, status = "", 200
    if request.method == "POST":
        if not portal.may(Capability.MANAGE_SECRET):
            raise PermissionDenied(capability_missing_text(Capability.MANAGE_SECRET))
        if form.is_valid():
            try:
                secret = actions.secret_rotate(portal, pk, form.overlap_span())
            except ValueError as refused:
                form.add_error("overlap", str(refused))
            else:
                found = actions.endpoint(portal, pk)
                form = SecretRotateForm()
        if not secret:
            status = 400
    keys, signing = (
        actions.public_keys(portal, pk) if portal.may(Capability.VIEW_SECRET) else ([], 0)
    )
    context = {
        "endpoint": found,
        "form": form,
        "secret": secret,
        "retiring_until": found.retiring_until if secret else None,
        "public_keys": keys,
        "signing": signing,
    }
    return page(request, "secret.html", context, section="endpoints", status=status)


# --- a test event --------------------------------------------------------------------------


@portal_page(Capability.RECOVER)
@require_http_methods(FORM_METHODS)
def endpoint_test(request: PortalRequest, pk: int) -> HttpResponse:
    portal = request.portal
    found = actions.endpoint(portal, pk)
    subscribed = list(found.event_types or [])
    posted = request.method == "POST"
    form = TestEventForm(request.POST if posted else None, subscribed=subscribed)
    sent, message, status = None, None, 200
    if posted:
        if form.is_valid():
            try:
                sent = actions.send_test_event(portal, pk, form.cleaned_data["event_type"])
            except ValueError as refused:  # not in the catalog, no example, or EventRefused
                form.add_error("event_type", str(refused))
            else:
                message = actions.message_of_key(portal, pk, sent.key)
        if sent is None:
            status = 400
    context = {"endpoint": found, "form": form, "sent": sent, "message": message}
    return page(request, "test_event.html", context, section="endpoints", status=status)
