"""RepairItem: what reconciliation found for a person to repair. The records are
read-only; four actions, each behind a permission of its own and each through its
service (reconcile/repair.py), which keeps the user, the time, the note and the result
in the item's history: replay a failed item, fetch and apply a missing one, ask the
sender to redeliver it, or resolve an item with a required note.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html_join
from django.utils.translation import ngettext

from ..core import display
from ..reconcile import repair
from ..reconcile.models import RepairItem
from .base import ReadOnlyAdmin
from .cells import pre
from .confirm import Confirmation, confirm_then_act
from .forms import NoteForm, RequiredNoteForm


@admin.register(RepairItem)
class RepairItemAdmin(ReadOnlyAdmin):
    list_display = (
        "updated_at",
        "source",
        "kind",
        "status",
        "event_key",
        "subject",
        "event_type",
        "occurred_at",
    )
    list_filter = ("kind", "status", "source", ("occurred_at", admin.DateFieldListFilter))
    search_fields = ("event_key__exact", "subject__exact")
    exclude = ("sender_says", "we_hold", "history")
    readonly_fields = (
        "source",
        "kind",
        "status",
        "event_key",
        "subject",
        "event_type",
        "occurred_at",
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

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "replay")

    def has_apply_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "apply")

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "redeliver")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "resolve")

    # --- actions -----------------------------------------------------------------------

    @admin.action(description="Replay the failed events of selected items…", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[RepairItem]):
        return self._confirm(
            request,
            queryset,
            "replay_selected",
            repair.repair_item_replay,
            explanation="Each failed item's event is replayed under its original key, as the "
            "failed events' admin would; an event applied since answers duplicate.",
            submit_label="Replay",
        )

    @admin.action(description="Fetch and apply selected missing events…", permissions=["apply"])
    def apply_selected(self, request: HttpRequest, queryset: QuerySet[RepairItem]):
        return self._confirm(
            request,
            queryset,
            "apply_selected",
            repair.repair_item_fetch_and_apply,
            explanation="Each missing event is applied as the sender's list gave it, through "
            "the claim under its own key. No signature vouches for it: the sender's API "
            "does, and your approval, which the receipt records. Applying twice answers "
            "duplicate.",
            submit_label="Fetch and apply",
        )

    @admin.action(
        description="Ask the sender to redeliver selected events…", permissions=["redeliver"]
    )
    def redeliver_selected(self, request: HttpRequest, queryset: QuerySet[RepairItem]):
        return self._confirm(
            request,
            queryset,
            "redeliver_selected",
            repair.repair_item_request_redelivery,
            explanation="The sender is asked to deliver each missing event again, where the "
            "source's adapter can ask; the item closes when a later run finds it received.",
            submit_label="Request redelivery",
        )

    @admin.action(description="Resolve selected items with a note…", permissions=["resolve"])
    def resolve_selected(self, request: HttpRequest, queryset: QuerySet[RepairItem]):
        return self._confirm(
            request,
            queryset,
            "resolve_selected",
            repair.repair_item_resolve,
            explanation="Resolving closes an item by hand. Nothing is applied or changed.",
            submit_label="Resolve",
            form=RequiredNoteForm,
        )

    def _confirm(
        self,
        request: HttpRequest,
        queryset: QuerySet[RepairItem],
        action_name: str,
        service: Callable[..., repair.RepairResult],
        *,
        explanation: str,
        submit_label: str,
        form: type[forms.Form] = NoteForm,
    ) -> TemplateResponse | None:
        confirmation = Confirmation(
            title=submit_label,
            explanation=(
                explanation,
                "Your name, the time, the note and the result are kept in each item's history.",
            ),
            form=form,
            submit=(f"{submit_label} (%d)", f"{submit_label} (%d)"),
            columns=("id", "source", "kind", "status", "event key", "subject", "event type"),
            row=lambda item: (
                item.pk,
                item.source,
                item.get_kind_display(),
                item.get_status_display(),
                item.event_key,
                item.subject,
                item.event_type,
            ),
        )
        return confirm_then_act(
            self,
            request,
            list(queryset.order_by("id")),
            action=action_name,
            confirmation=confirmation,
            act=lambda items, cleaned: self._run(request, items, service, note=cleaned["note"]),
        )

    def _run(
        self,
        request: HttpRequest,
        items: list[RepairItem],
        service: Callable[..., repair.RepairResult],
        *,
        note: str,
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

    @admin.display(description="history, oldest first")
    def action_history(self, obj: RepairItem) -> str:
        entries = [e for e in obj.history if isinstance(e, dict)]
        if not entries:
            return "-"
        return format_html_join(
            "",
            "<p>{} by {}: <strong>{}</strong>, {} {}<br>{}</p>",
            (
                (
                    e.get("at", ""),
                    e.get("by", ""),
                    e.get("action", ""),
                    e.get("result", ""),
                    e.get("detail", ""),
                    e.get("note", ""),
                )
                for e in entries
            ),
        )

    @admin.display(description="the sender says")
    def pretty_sender_says(self, obj: RepairItem) -> str:
        return pre(display.json_text(obj.sender_says))

    @admin.display(description="we hold")
    def pretty_we_hold(self, obj: RepairItem) -> str:
        return pre(display.json_text(obj.we_hold))
