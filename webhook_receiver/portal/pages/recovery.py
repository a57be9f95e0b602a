"""Recovery: an endpoint's plan page (**Plan** shows what a job would send and writes
nothing; **Start** starts it and goes to its page), the tenant's jobs with their
progress, a job's page, and **Cancel**."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.http import HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from ...outbound.models import MessageStatus, RecoveryJob, RecoveryKind, RecoveryState
from ...outbound.recovery import Plan, sent_counts
from ...presentation.display import duration_text
from .. import actions
from ..forms import RecoveryForm
from ..guard import PortalRequest, portal_page
from ..models import Capability
from .endpoints import FORM_METHODS, note_of, page

NOTES = {
    "started": _("Started: the relay sends its messages at its rate; this page follows it."),
    "cancelled": _("Cancelled: it releases nothing more; what it released is sent."),
    "not_running": _("It was not running any more."),
}
# how a portal session's actions are named on the records (actions.who)
PORTAL_BY = "portal session "


def ceil_seconds(span: timedelta) -> timedelta:
    return timedelta(seconds=math.ceil(span.total_seconds()))


def _initial(endpoint: Any) -> dict[str, Any]:
    """Since its last success (within its replay horizon), else an hour ago."""
    now = timezone.now()
    since = now - timedelta(hours=1)
    horizon = now - timedelta(days=endpoint.replay_horizon_days) + timedelta(minutes=1)
    if endpoint.last_success_at and endpoint.last_success_at > horizon:
        since = endpoint.last_success_at
    return {"kind": RecoveryKind.RECOVER, "since": timezone.localtime(since).replace(second=0)}


@portal_page(Capability.RECOVER)
@require_http_methods(FORM_METHODS)
def recovery_plan(request: PortalRequest, pk: int) -> HttpResponse:
    portal = request.portal
    found = actions.endpoint(portal, pk)
    if request.method != "POST":
        return _plan_page(request, found, RecoveryForm(initial=_initial(found)), None)
    form = RecoveryForm(request.POST)
    plan = None
    if form.is_valid():
        criteria, rate = form.criteria(), form.cleaned_data["rate"]
        try:
            if "start" in request.POST:
                job = actions.recovery_start(portal, pk, criteria, rate)
                target = reverse("webhook_portal:recovery_job", args=[job.pk])
                return HttpResponseRedirect(f"{target}?note=started")
            plan = actions.recovery_plan(portal, pk, criteria, rate)
        except ValueError as refused:  # RecoveryRefused is one
            form.add_error(None, str(refused))
    return _plan_page(request, found, form, plan, status=200 if plan else 400)


def _plan_page(
    request: PortalRequest, found: Any, form: RecoveryForm, plan: Plan | None, status: int = 200
) -> HttpResponse:
    context = {
        "endpoint": found,
        "form": form,
        "plan": plan,
        "plan_more": plan.count - len(plan.sample) if plan else 0,
        # whole seconds up: a fifth of a second is "about 1 s", not "about 0 s"
        "plan_duration": duration_text(ceil_seconds(plan.duration)) if plan else "",
    }
    # an endpoint's page (endpoints/<pk>/recover/): its section is the endpoints'
    return page(request, "recovery_plan.html", context, section="endpoints", status=status)


@dataclass(frozen=True)
class JobShown:
    job: RecoveryJob
    kind: str
    state: str
    sent: str
    percent: int
    started_by: str
    cancelled_by: str


def job_shown(job: RecoveryJob) -> JobShown:
    counts = sent_counts(job).items()
    sent = ", ".join(f"{n} {MessageStatus(s).label.split(' (')[0].lower()}" for s, n in counts)
    percent = int(100 * job.released / job.planned) if job.planned else 100
    return JobShown(
        job,
        str(RecoveryKind(job.kind).label),
        str(RecoveryState(job.state).label),
        sent or "-",
        percent,
        _who(job.created_by),
        _who(job.cancelled_by) if job.cancelled_by else "",
    )


def _who(by: str) -> str:
    """A portal session's action as such; the host's staff's names stay theirs."""
    if by.startswith(PORTAL_BY):
        return gettext("this portal (%(who)s)") % {"who": by}
    return gettext("the host's staff")


@portal_page()
@require_safe
def recovery_list(request: PortalRequest) -> HttpResponse:
    portal = request.portal
    asked = request.GET.get("endpoint", "")
    endpoint = actions.endpoint(portal, int(asked)) if asked.isdigit() else None
    jobs = actions.recovery_jobs(portal, endpoint=endpoint.name if endpoint else None)
    context = {"jobs": [job_shown(j) for j in jobs], "endpoint": endpoint}
    return page(request, "recovery_jobs.html", context, section="recovery")


@portal_page()
@require_safe
def recovery_detail(request: PortalRequest, pk: int) -> HttpResponse:
    job = actions.recovery_job(request.portal, pk)
    context = {
        "shown": job_shown(job),
        "job": job,
        "running": job.state == RecoveryState.RUNNING,
        "note": note_of(request, NOTES),
    }
    return page(request, "recovery_job.html", context, section="recovery")


@portal_page(Capability.RECOVER)
@require_POST
def recovery_cancel(request: PortalRequest, pk: int) -> HttpResponse:
    cancelled = actions.recovery_cancel(request.portal, pk)
    target = reverse("webhook_portal:recovery_job", args=[pk])
    return HttpResponseRedirect(f"{target}?note={'cancelled' if cancelled else 'not_running'}")
