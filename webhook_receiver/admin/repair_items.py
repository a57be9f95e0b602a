"""RepairItem: what reconciliation found for a person to repair. The records are
read-only; four actions, each behind a permission of its own and each through its
service (reconcile/repair.py), which keeps the user, the time, the note and the result
in the item's history: replay a failed item, fetch and apply a missing one, ask the
sender to redeliver it, or resolve an item with a required note.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..presentation import display
from ..reconcile import repair
from ..reconcile.models import RepairItem
from .base import ReadOnlyAdmin, custom_permission
from .cells import history_html, pre
from .confirm import Confirmation, Selection, confirm_then_act
from .forms import NoteForm, RequiredNoteForm

ITEMS = Selection(
    (_("id"), _("source"), _("kind"), _("status"), _("event key"), _("subject"), _("event type")),
    lambda item: (
        item.pk,
        item.source,
        item.get_kind_display(),
        item.get_status_display(),
        item.event_key,
        item.subject,
        item.event_type,
    ),
)
# an item's identity and state, in its list and first on its page
ITEM_FIELDS = ("source", "kind", "status", "event_key", "subject", "event_type", "occurred_at")


def _confirmation(action: str, label: Any, explanation: Any, form=NoteForm) -> Confirmation:
    return Confirmation(
        action=action,
        title=label,
        explanation=(
            explanation,
            _("Your name, the time, the note and the result are kept in each item's history."),
        ),
        form=form,
        submit=format_lazy("{} (%(count)d)", label),
        selection=ITEMS,
    )


# each action: its confirmation page, and the service it runs on every item
REPAIRS: dict[str, tuple[Confirmation, Callable[..., repair.RepairResult]]] = {
    "replay_selected": (
        _confirmation(
            "replay_selected",
            _("Replay"),
            _(
                "Each failed item's event is replayed under its original key, as the failed "
                "events' admin would; an event applied since answers duplicate."
            ),
        ),
        repair.repair_item_replay,
    ),
    "apply_selected": (
        _confirmation(
            "apply_selected",
            _("Fetch and apply"),
            _(
                "Each missing event is applied as the sender's list gave it, through the claim "
                "under its own key. No signature vouches for it: the sender's API does, and "
                "your approval, which the receipt records. Applying twice answers duplicate."
            ),
        ),
        repair.repair_item_fetch_and_apply,
    ),
    "redeliver_selected": (
        _confirmation(
            "redeliver_selected",
            _("Request redelivery"),
            _(
                "The sender is asked to deliver each missing event again, where the source's "
                "adapter can ask; the item closes when a later run finds it received."
            ),
        ),
        repair.repair_item_request_redelivery,
    ),
    "resolve_selected": (
        _confirmation(
            "resolve_selected",
            _("Resolve"),
            _("Resolving closes an item by hand. Nothing is applied or changed."),
            form=RequiredNoteForm,
        ),
        repair.repair_item_resolve,
    ),
}


def _repair_action(name: str, description: Any, permission: str) -> Callable[..., Any]:
    """The list action ``name``: its confirmation page, then its service (REPAIRS)."""

    @admin.action(description=description, permissions=[permission])
    def action(
        model_admin: RepairItemAdmin, request: HttpRequest, queryset: QuerySet[RepairItem]
    ) -> TemplateResponse | None:
        confirmation, service = REPAIRS[name]
        act = functools.partial(model_admin._run, service=service)
        return confirm_then_act(model_admin, request, queryset.order_by("id"), confirmation, act)

    action.__name__ = name
    return action


@admin.register(RepairItem)
class RepairItemAdmin(ReadOnlyAdmin):
    list_display = ("updated_at", *ITEM_FIELDS)
    list_filter = ("kind", "status", "source", ("occurred_at", admin.DateFieldListFilter))
    search_fields = ("event_key__exact", "subject__exact")
    exclude = ("sender_says", "we_hold", "history")
    readonly_fields = (
        *ITEM_FIELDS,
        "pretty_sender_says",
        "pretty_we_hold",
        "first_run",
        "last_run",
        "created_at",
        "updated_at",
        "resolved_by",
        "resolved_at",
        "resolution_note",
        "action_history",
    )

    actions = ["replay_selected", "apply_selected", "redeliver_selected", "resolve_selected"]

    # --- permissions: the four custom ones from RepairItem.Meta.permissions ------------

    has_replay_permission = custom_permission("replay")
    has_apply_permission = custom_permission("apply")
    has_redeliver_permission = custom_permission("redeliver")
    has_resolve_permission = custom_permission("resolve")
    # --- actions: each its confirmation, then its service on every item ---------------

    replay_selected = _repair_action(
        "replay_selected", _("Replay the failed events of selected items…"), "replay"
    )
    apply_selected = _repair_action(
        "apply_selected", _("Fetch and apply selected missing events…"), "apply"
    )
    redeliver_selected = _repair_action(
        "redeliver_selected", _("Ask the sender to redeliver selected events…"), "redeliver"
    )
    resolve_selected = _repair_action(
        "resolve_selected", _("Resolve selected items with a note…"), "resolve"
    )

    def _run(
        self,
        request: HttpRequest,
        items: list[RepairItem],
        note: str,
        *,
        service: Callable[..., repair.RepairResult],
    ) -> None:
        actor = request.user.get_username()
        results = [service(item_id=item.pk, actor=actor, note=note) for item in items]
        for item, result in zip(items, results, strict=True):
            self.log_change(request, item, f"{result.action}: {result.result} {result.detail}")
        counts = Counter(r.result for r in results)
        summary = ", ".join(f"{n} {result}" for result, n in sorted(counts.items()))
        message = ngettext(
            "%(action)s, %(count)d item: %(summary)s.",
            "%(action)s, %(count)d items: %(summary)s.",
            len(results),
        ) % {"action": results[0].action.capitalize(), "count": len(results), "summary": summary}
        problems = [r for r in results if not r.ok]
        if problems:
            message += " " + "; ".join(f"#{r.item_id}: {r.detail}" for r in problems[:5])
        level = messages.WARNING if problems else messages.SUCCESS
        self.message_user(request, message, level)

    @admin.display(description=_("history, oldest first"))
    def action_history(self, obj: RepairItem) -> str:
        return history_html(
            obj.history,
            "<p>{} by {}: <strong>{}</strong>, {} {}<br>{}</p>",
            ("at", "by", "action", "result", "detail", "note"),
        )

    @admin.display(description=_("the sender says"))
    def pretty_sender_says(self, obj: RepairItem) -> str:
        return pre(display.json_text(obj.sender_says))

    @admin.display(description=_("we hold"))
    def pretty_we_hold(self, obj: RepairItem) -> str:
        return pre(display.json_text(obj.we_hold))
