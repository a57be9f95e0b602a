"""Recover a destination's messages with a recovery job (docs/sending.md, "Recovery
jobs"): plan it, start it, follow it, cancel it.

    manage.py webhook_recover merchant-7 --since 2026-12-07T08:00 --dry-run
    manage.py webhook_recover merchant-7 --since 2h                       (recover failed)
    manage.py webhook_recover merchant-7 --since 1d --kind missing --types order.*
    manage.py webhook_recover merchant-7 --since 3h --until 1h --kind replay --rate 5
    manage.py webhook_recover --list [merchant-7]
    manage.py webhook_recover --cancel 12

``--since`` and ``--until`` take an ISO 8601 time (in TIME_ZONE when it has no offset)
or a span before now (``90m``, ``2h``, ``1d``). The dry run prints what the job would
send, and how many, and writes nothing. A started job is run by the relay processes
(``manage.py webhook_relay``), at its rate (half the destination's unless ``--rate``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ...outbound.models import RecoveryJob, RecoveryKind, WebhookDestination
from ...outbound.recovery import (
    ANSWER_CLASSES,
    Criteria,
    Plan,
    RecoveryRefused,
    recovery_cancel,
    recovery_jobs_shown,
    recovery_plan,
    recovery_start,
    sent_counts,
)
from ...outbound.tenancy import EVERY_TENANT
from ...presentation.display import duration_text
from ..spans import parse_span

BY = "manage.py webhook_recover"


def parse_moment(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (naive: in TIME_ZONE) or a span before ``now`` ("2h")."""
    try:
        span = parse_span(text)
        if span is not None:
            return now - span
    except OverflowError:
        raise CommandError(f"{text!r} is further back than a date can be") from None
    try:
        moment = parse_datetime(text.strip())
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(
            f"{text!r} is not a time: give an ISO 8601 time (2026-12-07T08:00, +01:00 "
            "or Z for its zone) or a span before now (90m, 2h, 1d)"
        )
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def _listed(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


class Command(BaseCommand):
    help = (
        "Recover a destination's failed messages, replay those it missed or those it was "
        "delivered, as a recovery job paced below its rate; or list and cancel jobs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("destination", nargs="?", help="the destination's name")
        parser.add_argument("--since", help="from this time: ISO 8601, or 90m, 2h, 1d ago")
        parser.add_argument("--until", help="up to this time (default: now)")
        parser.add_argument(
            "--kind",
            choices=RecoveryKind.values,
            default=RecoveryKind.RECOVER,
            help="recover failed messages (default), replay the missing ones (never sent "
            "to it), or replay the delivered ones",
        )
        parser.add_argument("--types", help="event types or group.* patterns, comma-separated")
        parser.add_argument(
            "--answers",
            help=f"the last answer's classes, comma-separated: {', '.join(ANSWER_CLASSES)}",
        )
        parser.add_argument("--ordering-key-prefix", default="", help="e.g. order:ord_1042")
        parser.add_argument("--rate", type=float, help="messages a second (default: half its rate)")
        parser.add_argument("--dry-run", action="store_true", help="print the plan; send nothing")
        parser.add_argument("--list", action="store_true", help="the last jobs and their progress")
        parser.add_argument("--cancel", type=int, metavar="JOB", help="stop a running job")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cancel"] is not None:
            self._cancel(options["cancel"])
        elif options["list"]:
            self._list(options["destination"])
        else:
            self._recover(options)

    def _recover(self, options: dict[str, Any]) -> None:
        name, since = options["destination"], options["since"]
        if not name or not since:
            raise CommandError("name the destination and give --since (or use --list, --cancel)")
        now = timezone.now()
        criteria = Criteria(
            kind=options["kind"],
            since=parse_moment(since, now),
            until=parse_moment(options["until"], now) if options["until"] else None,
            event_types=_listed(options["types"]),
            answer_classes=_listed(options["answers"]),
            ordering_key_prefix=options["ordering_key_prefix"],
        )
        try:
            destination = EVERY_TENANT.destinations().only("id").get(name=name)
        except WebhookDestination.DoesNotExist:
            raise CommandError(f"no destination named {name!r}") from None
        try:
            if options["dry_run"]:
                plan = recovery_plan(
                    scope=EVERY_TENANT,
                    destination=destination,
                    criteria=criteria,
                    rate=options["rate"],
                    now=now,
                )
                self.stdout.write(plan_text(plan))
                return
            job = recovery_start(
                scope=EVERY_TENANT,
                destination=destination,
                criteria=criteria,
                by=BY,
                rate=options["rate"],
                now=now,
            )
        except RecoveryRefused as exc:
            raise CommandError(f"{name}: refused: {exc}") from None
        self.stdout.write(
            f"started recovery #{job.pk} of {name}: {job.planned} message(s) at {job.rate:g}/s; "
            "the relay processes (manage.py webhook_relay) send them. Follow it with "
            "manage.py webhook_recover --list; stop it with --cancel "
            f"{job.pk}"
        )

    def _list(self, name: str | None) -> None:
        jobs = recovery_jobs_shown(scope=EVERY_TENANT, destination_name=name)
        if not jobs:
            self.stdout.write("no recovery jobs" + (f" of {name}" if name else ""))
        for job in jobs:
            self.stdout.write(job_text(job))

    def _cancel(self, job_id: int) -> None:
        try:
            cancelled = recovery_cancel(scope=EVERY_TENANT, job=job_id, by=BY)
        except RecoveryJob.DoesNotExist:
            raise CommandError(f"no recovery job #{job_id}") from None
        if not cancelled:
            raise CommandError(f"recovery #{job_id} is not running: nothing to cancel")
        self.stdout.write(
            f"cancelled recovery #{job_id}: it releases nothing more; what it released is sent"
        )


def plan_text(plan: Plan) -> str:
    """A plan as the dry run prints it."""
    criteria = plan.criteria
    span = f"admitted since {criteria.since.isoformat(timespec='seconds')}"
    if criteria.until:
        span += f" until {criteria.until.isoformat(timespec='seconds')}"
    lines = [
        f"{plan.destination}: {RecoveryKind(criteria.kind).label.lower()} {span}: "
        f"{plan.count} message(s) would be sent, at {plan.rate:g}/s "
        f"(about {duration_text(plan.duration)}); nothing was sent "
        "(dry run)"
    ]
    if plan.matched_types is not None:
        lines.append(f"  event types: {', '.join(plan.matched_types) or 'none'}")
    lines += [f"  {key} ({event_type}, admitted {at.isoformat(timespec='seconds')})"
              for key, event_type, at in plan.sample]  # fmt: skip
    if plan.count > len(plan.sample):
        lines.append(f"  … and {plan.count - len(plan.sample)} more")
    lines += [f"  note: {warning}" for warning in plan.warnings]
    return "\n".join(lines)


def job_text(job: RecoveryJob) -> str:
    """One job as --list prints it: its number, destination, kind, state, progress and
    who started it."""
    outcome = ", ".join(f"{count} {status}" for status, count in sent_counts(job).items())
    line = (
        f"#{job.pk} {job.destination.name} {job.kind} {job.state}: {job.released} of "
        f"{job.planned} released"
        + (f" ({outcome})" if outcome else "")
        + f", at {job.rate:g}/s; started by {job.created_by} at "
        f"{job.created_at.isoformat(timespec='seconds')}"
    )
    if job.cancelled_by:
        line += f"; cancelled by {job.cancelled_by}"
    return line
