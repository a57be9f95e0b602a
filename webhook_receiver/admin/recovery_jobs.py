"""Recovery jobs (outbound/recovery.py): listed with their progress, started from a
plan, cancelled. A job is evidence once started: its page is read-only.

**Add** is the plan page: the destination (a destination's **Recover…** button opens it
with that one chosen), the kind, the span, the types, answer classes and ordering key
prefix, and the rate. **Plan** shows what the job would send, how many, the first few
and how long it takes, writing nothing; **Start** starts it, and its page follows it.
Starting takes the add permission, **Cancel** the job's own cancel permission.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..outbound.models import (
    MessageStatus,
    RecoveryJob,
    RecoveryState,
    WebhookDestination,
)
from ..outbound.recovery import (
    RecoveryRefused,
    recovery_cancel,
    recovery_plan,
    recovery_start,
    sent_counts,
    with_sent_counts,
)
from ..outbound.recovery_form import RecoveryCriteriaForm
from ..outbound.tenancy import EVERY_TENANT
from ..presentation.admin_links import admin_url
from ..presentation.display import duration_text
from .base import ReadOnlyAdmin, custom_permission
from .cells import full_time, moment_cell

PLAN_TEMPLATE = "admin/webhook_receiver/recoveryjob/plan.html"


class RecoveryForm(RecoveryCriteriaForm):
    """The plan page's form: the destination to recover, and its types as text."""

    destination = forms.ModelChoiceField(
        queryset=WebhookDestination.objects.defer("secrets").order_by("name"),
        label=_("Destination"),
    )
    event_types = forms.CharField(
        label=_("Event types"),
        required=False,
        help_text=_("Names or group.* patterns, comma-separated. Empty: every type."),
    )
    field_order = ["destination", "kind", "since", "until", "event_types"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["since"].help_text = gettext(
            "In %(time_zone)s. Nothing older than the destination's replay horizon."
        ) % {"time_zone": timezone.get_current_timezone_name()}
        self.fields["rate"].help_text = gettext(
            "Below the destination's own, so live traffic keeps its share. Empty: half."
        )

    def event_type_names(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["event_types"].split(",") if t.strip()]


@admin.register(RecoveryJob)
class RecoveryJobAdmin(ReadOnlyAdmin):
    list_display = ("number", "destination", "kind", "state", "progress", "sent", "span",
                    "started")  # fmt: skip
    list_display_links = ("number",)
    list_filter = ("state", "kind")
    search_fields = ("destination__name", "destination__tenant", "created_by")
    list_select_related = ("destination",)
    actions = ["cancel_selected"]
    fields = ("destination", "kind", "state", "progress", "sent", "span", "event_types",
              "matched_types", "answer_classes", "ordering_key_prefix", "rate_shown",
              "created_by", "started", "finished", "cancelled_by")  # fmt: skip

    has_cancel_permission = custom_permission("cancel")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # starting a job: the model's add permission (the add view is the plan page)
        return request.user.has_perm(f"{self.opts.app_label}.add_recoveryjob")

    def get_queryset(self, request: HttpRequest) -> QuerySet[RecoveryJob]:
        return with_sent_counts(super().get_queryset(request).defer("destination__secrets"))

    # --- cells ---------------------------------------------------------------------------

    @admin.display(description=_("job"), ordering="id")
    def number(self, job: RecoveryJob) -> str:
        return f"#{job.pk}"

    @admin.display(description=_("released"))
    def progress(self, job: RecoveryJob) -> str:
        return gettext("%(released)d of %(planned)d") % {
            "released": job.released,
            "planned": job.planned,
        }

    @admin.display(description=_("their status now"))
    def sent(self, job: RecoveryJob) -> str:
        counts = sent_counts(job).items()
        return ", ".join(f"{n} {MessageStatus(s).label.lower()}" for s, n in counts) or "-"

    @admin.display(description=_("admitted"))
    def span(self, job: RecoveryJob) -> str:
        until = moment_cell(job.until) if job.until else gettext("its start")
        return format_html(gettext("{since} to {until}"), since=moment_cell(job.since), until=until)

    @admin.display(description=_("rate"))
    def rate_shown(self, job: RecoveryJob) -> str:
        return gettext("%(rate)g/s") % {"rate": job.rate}

    @admin.display(description=_("started"), ordering="created_at")
    def started(self, job: RecoveryJob) -> str:
        return moment_cell(job.created_at)

    @admin.display(description=_("finished"))
    def finished(self, job: RecoveryJob) -> str:
        return full_time(job.finished_at) if job.finished_at else "-"

    # --- the plan page (add) -------------------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            return super().add_view(request, form_url, extra_context)  # its 403
        plan = None
        if request.method == "POST":
            form = RecoveryForm(request.POST)
            if form.is_valid():
                data = form.cleaned_data
                dest, criteria, rate = data["destination"], form.criteria(), data["rate"]
                try:
                    if "_start" in request.POST:
                        by = request.user.get_username()
                        job = recovery_start(
                            scope=EVERY_TENANT,
                            destination=dest,
                            criteria=criteria,
                            by=by,
                            rate=rate,
                        )
                        return self._started(request, job)
                    plan = recovery_plan(
                        scope=EVERY_TENANT, destination=dest, criteria=criteria, rate=rate
                    )
                except RecoveryRefused as exc:
                    form.add_error(None, str(exc))
        else:
            form = RecoveryForm(initial=_initial(request.GET.get("destination")))
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Plan a recovery"),
            "opts": self.opts,
            "form": form,
            "plan": plan,
            "plan_more": plan.count - len(plan.sample) if plan else 0,
            "plan_duration": duration_text(plan.duration) if plan else "",
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, PLAN_TEMPLATE, context)

    def _started(self, request: HttpRequest, job: RecoveryJob) -> HttpResponse:
        note = ngettext(
            "Started recovery #%(job)d: %(count)d message, at %(rate)g/s.",
            "Started recovery #%(job)d: %(count)d messages, at %(rate)g/s.",
            job.planned,
        ) % {"job": job.pk, "count": job.planned, "rate": job.rate}
        self.log_addition(request, job, note)
        self.message_user(
            request,
            note + " " + gettext("The relay processes send them; this page follows it."),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(self.object_change_url(job))

    def object_change_url(self, job: RecoveryJob) -> str:
        return admin_url(RecoveryJob, "change", job.pk) or "../"

    # --- Cancel ----------------------------------------------------------------------------

    @admin.action(description=_("Cancel the selected jobs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[RecoveryJob]) -> None:
        by = request.user.get_username()
        for job in queryset.filter(state=RecoveryState.RUNNING).order_by("id"):
            if recovery_cancel(scope=EVERY_TENANT, job=job.pk, by=by):
                self.log_change(request, job, "Cancelled.")
                self.message_user(
                    request,
                    gettext(
                        "Cancelled recovery #%(job)d: it releases nothing more; the "
                        "%(released)d it released are sent."
                    )
                    % {"job": job.pk, "released": job.released},
                    messages.SUCCESS,
                )


def _initial(destination: str | None) -> dict[str, Any]:
    """The plan page's first values: the destination asked for, and since its last
    success (else an hour ago)."""
    initial: dict[str, Any] = {"since": timezone.now() - timedelta(hours=1)}
    if destination and destination.isdigit():
        found = WebhookDestination.objects.filter(pk=int(destination)).defer("secrets").first()
        if found is not None:
            initial["destination"] = found
            if found.last_success_at:
                initial["since"] = found.last_success_at
    return initial
