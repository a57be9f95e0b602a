"""What a destination answered, as the outbox's pages show it: its text to staff who may
change the destination (``change_webhookdestination``), its status and size to others.

A merchant's answer is text someone else wrote: it can echo the request, carry a stack
trace or a token of its own. Whoever may change where the outbox sends needs to read it;
whoever may only look at the messages learns that an answer came, its status and its
size. A message's ``last_error`` is its last answer's excerpt when it has a status code, so
the list's and the page's "last answer" (presentation/display.answer_shown, as the portal shows
it) follow the same rule as the attempts table.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..outbound.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from ..presentation.display import answer_shown
from .base import _ModelAdminMixin
from .cells import full_time

# a message's page shows its newest attempts (a destination pacing us with 429s can
# make many: they do not spend the retry budget)
ATTEMPTS_SHOWN = 100
ATTEMPT_COLUMNS = (_("started"), _("took"), _("answer"), _("response"), _("next eligible"))
# the list shows the start of the last answer; its title holds the whole of it
LAST_ANSWER_CHARS = 70
LAST_ANSWER_TITLE_CHARS = 2000
# each field that shows an answer's text, and its twin for those who may not read it
HIDDEN_TWINS = {
    "last_answer": "last_answer_hidden",
    "last_answer_full": "last_answer_full_hidden",
    "attempt_history": "attempt_history_hidden",
}


def may_read_answers(request: HttpRequest) -> bool:
    opts = WebhookDestination._meta
    return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")


def hidden_size(text: str) -> str:
    """ "412 bytes, hidden: you may not change this destination"."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return ngettext(
        "%(size)d byte, hidden: you may not change this destination",
        "%(size)d bytes, hidden: you may not change this destination",
        size,
    ) % {"size": size}


def attempts_table(message: OutboxMessage, *, readable: bool) -> str:
    """The message's newest attempts, oldest first; each answer's excerpt unless not
    ``readable``, then its size."""
    newest = list(message.attempt_set.order_by("-number")[:ATTEMPTS_SHOWN])
    if not newest:
        return gettext("None yet.")
    earlier = message.attempt_set.count() - len(newest) if len(newest) == ATTEMPTS_SHOWN else 0
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        '<td><pre class="wr-excerpt">{}</pre></td><td>{}</td></tr>',
        (
            (
                a.number,
                full_time(a.started_at),
                f"{a.duration_ms} ms",
                _attempt_answer(a),
                _excerpt(a.response_excerpt, readable),
                full_time(a.next_attempt_at) if a.next_attempt_at else "-",
            )
            for a in reversed(newest)
        ),
    )
    note = gettext("%(count)d earlier attempts are not shown.") % {"count": earlier}
    return format_html(
        '{}<table class="wr-attempts"><thead><tr><th>#</th>{}</tr></thead><tbody>{}</tbody>'
        "</table>",
        format_html("<p>{}</p>", note) if earlier else "",
        format_html_join("", "<th>{}</th>", ((column,) for column in ATTEMPT_COLUMNS)),
        rows,
    )


def _excerpt(text: str, readable: bool) -> str:
    if not text:
        return "-"
    return text if readable else hidden_size(text)


def _attempt_answer(attempt: DeliveryAttempt) -> str:
    if attempt.status_code is not None:
        return f"HTTP {attempt.status_code}"
    return attempt.error or "-"


def _short(full: str) -> str:
    """The list's cell: the answer's start, the whole of it in the title."""
    if not full:
        return "-"
    short = full
    if len(short) > LAST_ANSWER_CHARS:
        short = short[: LAST_ANSWER_CHARS - 1].rstrip() + "…"
    return format_html('<span title="{}">{}</span>', full[:LAST_ANSWER_TITLE_CHARS], short)


def _twin(field: Any) -> Any:
    return HIDDEN_TWINS.get(field, field) if isinstance(field, str) else field


class AnswerFields(_ModelAdminMixin):
    """The outbox messages' answer fields, each swapped for its twin (HIDDEN_TWINS) in
    the list and on the page for a user who may not read answers."""

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)
        if may_read_answers(request):
            return shown
        return [_twin(name) for name in shown]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if may_read_answers(request):
            return fieldsets
        return [
            (name, {**options, "fields": [_twin(f) for f in options["fields"]]})
            for name, options in fieldsets
        ]

    @staticmethod
    def _last(obj: OutboxMessage, readable: bool) -> str:
        hidden = None if readable else hidden_size
        return answer_shown(obj.last_status_code, obj.last_error, hidden=hidden)

    @admin.display(description=_("last answer"), ordering="last_status_code")
    def last_answer(self, obj: OutboxMessage) -> str:
        return _short(self._last(obj, True))

    @admin.display(description=_("last answer"), ordering="last_status_code")
    def last_answer_hidden(self, obj: OutboxMessage) -> str:
        return _short(self._last(obj, False))

    @admin.display(description=_("last answer"))
    def last_answer_full(self, obj: OutboxMessage) -> str:
        return self._last(obj, True) or "-"

    @admin.display(description=_("last answer"))
    def last_answer_full_hidden(self, obj: OutboxMessage) -> str:
        return self._last(obj, False) or "-"

    @admin.display(description=_("attempts"))
    def attempt_history(self, obj: OutboxMessage) -> str:
        return attempts_table(obj, readable=True)

    @admin.display(description=_("attempts"))
    def attempt_history_hidden(self, obj: OutboxMessage) -> str:
        return attempts_table(obj, readable=False)
