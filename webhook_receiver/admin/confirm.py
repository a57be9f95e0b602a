"""The admin's one confirm-then-act flow, for every operator action that changes records
(discard and replay failed events, retry and discard outbox messages, recover a
destination, the four repairs of reconciliation's items).

An action shows a confirmation page first: what will happen, the selection (each row
saying whether the action applies to it), and the note the action keeps on its records.
Posted back valid, the action runs through its service and the admin returns to where
the action started. One template renders every such page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

TEMPLATE = "admin/webhook_receiver/action_confirmation.html"
# a confirmation page lists this many of the selection; the action takes them all
SELECTION_SHOWN = 100
LEFT_AS_IT_IS = _("(left as it is)")


@dataclass(frozen=True)
class Selection:
    """How a confirmation page lists the selected records: its headings, the cells of one
    record, and which cell shows the record's status."""

    columns: Sequence[StrOrPromise]
    row: Callable[[Any], Sequence[Any]]
    status_column: int = 0


@dataclass(frozen=True)
class Confirmation:
    """What an action's confirmation page says and asks."""

    # the list action's name, which the page's form posts back to
    action: str
    title: StrOrPromise
    # what the action does, a paragraph each
    explanation: Sequence[StrOrPromise]
    # the note the action keeps (admin/forms.py): a form of one field
    form: type[forms.Form]
    # the submit button, for the count: ngettext_lazy(singular, plural, "count"), each
    # with %(count)d; or (singular, plural), each with %d, as ngettext takes them
    submit: StrOrPromise | tuple[str, str]
    selection: Selection
    # the statuses of the records the action changes (None: every record's); the others'
    # status cell says that they are left as they are
    applies: tuple[str, ...] | None = None


def confirm_then_act(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    selection: Iterable[Any],
    confirmation: Confirmation,
    act: Callable[[HttpRequest, list[Any], Any], None],
    *,
    initial: dict[str, Any] | None = None,
) -> TemplateResponse | None:
    """The confirmation page of ``confirmation.action`` for ``selection``; once posted back
    valid, ``act(request, selected, note)`` (the note: the form's one field) and None, so
    that the admin returns to the list or the record's page."""
    selected = list(selection)
    if request.POST.get("post"):
        form = confirmation.form(request.POST)
        if form.is_valid():
            act(request, selected, next(iter(form.cleaned_data.values())))
            return None
    else:
        form = confirmation.form(initial=initial)
    count = len(selected)
    listing, applies = confirmation.selection, confirmation.applies
    untouched = {r.pk for r in selected if applies is not None and r.status not in applies}
    rows = []
    for record in selected[:SELECTION_SHOWN]:
        cells = list(listing.row(record))
        if record.pk in untouched:
            cells[listing.status_column] = f"{cells[listing.status_column]} {LEFT_AS_IT_IS}"
        rows.append(cells)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": confirmation.title,
        "subtitle": None,
        "opts": model_admin.opts,
        "explanation": confirmation.explanation,
        "columns": listing.columns,
        "rows": rows,
        "selected": selected,
        "not_shown": max(0, count - SELECTION_SHOWN),
        "untouched": len(untouched),
        "form": form,
        "note_field": form[next(iter(form.fields))],
        "submit_label": _counted(confirmation.submit, count, count),
        "action_name": confirmation.action,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": model_admin.media + form.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def report_changed(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    done: StrOrPromise | tuple[str, str],
    *,
    changed: int,
    selected: int,
    why_left: tuple[str, str],
) -> None:
    """An action's outcome, in one message: how many it changed (``done``: singular and
    plural, each with %(count)d: ngettext_lazy(…, "count") or the pair), and how many of
    the selection it left as they were and why (``why_left``: for one, for several); a
    warning when any were left."""
    message = _counted(done, changed, {"count": changed})
    left = selected - changed
    if left:
        why = why_left[0] if left == 1 else why_left[1]
        message += " " + ngettext(
            "%(count)d was left as it was (%(why)s).",
            "%(count)d were left as they were (%(why)s).",
            left,
        ) % {"count": left, "why": why}
    model_admin.message_user(request, message, messages.WARNING if left else messages.SUCCESS)


def _counted(text: StrOrPromise | tuple[str, str], count: int, pair_values: Any) -> str:
    """``text`` for ``count``: a string of ngettext_lazy(…, "count")'s, with %(count)d; or
    a (singular, plural) pair as ngettext takes them, filled with ``pair_values``."""
    if isinstance(text, tuple):
        return ngettext(*text, count) % pair_values
    return text % {"count": count}
