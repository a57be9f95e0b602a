"""The message log (filtered, 50 a page, with a bulk **Retry now**) and a message's story
(its fields, payload and attempts, newest first).

What a merchant's server answered is shown as text only to a session that may manage
endpoints (actions.may_read_answers); others read its status and its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse
from django.utils.html import format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, ngettext
from django.views.decorators.http import require_POST, require_safe

from ...outbound.admission import FILTER
from ...outbound.endpoints import offered_catalog
from ...outbound.models import DeliveryAttempt, MessageStatus, OutboxMessage
from ...outbound.operations import RETRYABLE
from ...presentation.display import answer_shown, json_text
from .. import actions
from ..forms import MessageFilterForm
from ..guard import PortalRequest, portal_page, refusal
from ..models import Capability
from .endpoints import page

PAGE_SIZE = 50
# the most messages one Retry now takes (a page holds PAGE_SIZE)
RETRY_MAX = 500
# the list shows the start of the last answer; its title holds more
ANSWER_CHARS = 70
ANSWER_TITLE_CHARS = 2000
# what a redirect may carry back, besides the filter's fields
NOT_KEPT = ("page", "retried", "asked")


def state_label(status: str) -> str:
    """ "Failed", of "Failed (terminal: for an operator)": the portal's word."""
    return str(MessageStatus(status).label).split(" (")[0]


def hidden_size(text: str) -> str:
    size = len(text.encode("utf-8", "surrogatepass"))
    return ngettext("%(size)d byte, hidden", "%(size)d bytes, hidden", size) % {"size": size}


def wrapping(text: str) -> SafeString:
    """``text`` (a key, an event type) allowed to break after each dot, colon and
    underscore in a narrow column, rather than anywhere."""
    words = re.split(r"(?<=[._:])", text)
    return format_html_join(mark_safe("<wbr>"), "{}", ((w,) for w in words))


def _short(text: str) -> str:
    if len(text) <= ANSWER_CHARS:
        return text
    return text[: ANSWER_CHARS - 1].rstrip() + "…"


@dataclass(frozen=True)
class Row:
    message: OutboxMessage
    state: str
    answer: str
    answer_full: str
    retryable: bool

    @property
    def key_html(self) -> SafeString:
        return wrapping(self.message.key)

    @property
    def type_html(self) -> SafeString:
        return wrapping(self.message.event_type)


@portal_page()
@require_safe
def message_list(request: PortalRequest) -> HttpResponse:
    portal = request.portal
    endpoints = actions.endpoint_choices(portal)
    asked = request.GET.get("endpoint", "")
    if asked and asked not in {str(pk) for pk, _name in endpoints}:
        raise Http404("not found")  # another tenant's endpoint is no endpoint at all
    form = MessageFilterForm(request.GET, endpoints=endpoints)
    found = actions.messages(portal).none()
    if form.is_valid():
        try:
            found = actions.messages(portal, **form.narrowing())
        except ValueError as refused:
            form.add_error("status", str(refused))
    listed = Paginator(found, PAGE_SIZE).get_page(request.GET.get("page"))
    readable = actions.may_read_answers(portal)
    hidden = None if readable else hidden_size
    may_retry = portal.may(Capability.RECOVER)
    rows = []
    for m in listed:
        full = answer_shown(m.last_status_code, m.last_error, hidden=hidden)
        retryable = may_retry and m.status in RETRYABLE
        rows.append(
            Row(m, state_label(m.status), _short(full), full[:ANSWER_TITLE_CHARS], retryable)
        )
    kept = request.GET.copy()
    for name in NOT_KEPT:
        kept.pop(name, None)
    context = {
        "form": form,
        "rows": rows,
        "listed": listed,
        "query": kept.urlencode(),
        "here": request.get_full_path(),
        "type_names": [e.name for e in offered_catalog()],
        "note": _retried_note(request.GET.get("retried"), request.GET.get("asked")),
        "any_retryable": any(r.retryable for r in rows),
        "readable": readable,
    }
    status = 400 if form.errors else 200
    return page(request, "messages.html", context, section="messages", status=status)


def _retried_note(retried: str | None, asked: str | None) -> str:
    if retried is None or not retried.isdigit():
        return ""
    done = int(retried)
    wanted = int(asked) if asked and asked.isdigit() else done
    if not wanted:
        return gettext("Select the messages to retry first.")
    note = ngettext(
        "%(done)d message of %(asked)d is due now: the relay sends it next.",
        "%(done)d messages of %(asked)d are due now: the relay sends them next.",
        done,
    ) % {"done": done, "asked": wanted}
    if done < wanted:
        note += " " + gettext(
            "The others were neither failed nor pending (delivered, sending or discarded) "
            "and were left as they are."
        )
    return note


@portal_page(Capability.RECOVER)
@require_POST
def messages_retry(request: PortalRequest) -> HttpResponse:
    """Retry the ticked messages now, then back to where the form was (the log with its
    filter, or a message's story), with how many."""
    try:
        ids = sorted({int(value) for value in request.POST.getlist("ids")})
    except ValueError:
        raise Http404("not found") from None
    if len(ids) > RETRY_MAX:
        reason = gettext("At most %(count)d messages at once.") % {"count": RETRY_MAX}
        return refusal(request, reason, status=400)
    retried = actions.messages_retry(request.portal, ids) if ids else []
    return HttpResponseRedirect(_back(request, len(retried), len(ids)))


def _back(request: PortalRequest, retried: int, asked: int) -> str:
    """The portal page the form came from (``next``), with the count; the log
    otherwise. Never another site, nor a page outside the portal."""
    root = reverse("webhook_portal:enter")
    wanted = request.POST.get("next", "")
    allowed = url_has_allowed_host_and_scheme(wanted, {request.get_host()})
    path, query = urlsplit(wanted).path, urlsplit(wanted).query
    if not (allowed and wanted.startswith(root) and path.startswith(root)):
        path, query = reverse("webhook_portal:messages"), ""
    kept = QueryDict(query, mutable=True)
    for name in NOT_KEPT:
        kept.pop(name, None)
    kept["retried"], kept["asked"] = str(retried), str(asked)
    return f"{path}?{kept.urlencode()}"


@dataclass(frozen=True)
class AttemptShown:
    attempt: DeliveryAttempt
    answer: str
    # the answer's excerpt, or its size for a session that may not read it
    excerpt: str
    hidden: str
    error: str


def attempt_shown(a: DeliveryAttempt, readable: bool) -> AttemptShown:
    text = a.response_excerpt
    return AttemptShown(
        a,
        f"HTTP {a.status_code}" if a.status_code is not None else "",
        text if readable else "",
        hidden_size(text) if text and not readable else "",
        a.error if a.status_code is None else "",
    )


@portal_page()
@require_safe
def message_detail(request: PortalRequest, pk: int) -> HttpResponse:
    portal = request.portal
    message = actions.message(portal, pk)
    readable = actions.may_read_answers(portal)
    shown = message.shown_attempts  # type: ignore[attr-defined]
    attempts = [attempt_shown(a, readable) for a in shown]
    metadata = message.metadata if isinstance(message.metadata, dict) else {}
    context = {
        "message": message,
        "state": state_label(message.status),
        "payload": json_text(message.payload),
        "answer": answer_shown(
            message.last_status_code,
            message.last_error,
            hidden=None if readable else hidden_size,
        ),
        "attempts": attempts,
        "earlier": message.attempt_count - len(attempts),  # type: ignore[attr-defined]
        "by_filter": message.discarded_by == FILTER,
        "test_event": bool(metadata.get("test_by")),
        "retryable": portal.may(Capability.RECOVER) and message.status in RETRYABLE,
        "here": request.get_full_path(),
        "readable": readable,
        "note": _retried_note(request.GET.get("retried"), request.GET.get("asked")),
    }
    return page(request, "message.html", context, section="messages")
