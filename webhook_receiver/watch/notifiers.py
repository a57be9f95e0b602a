"""Who hears of a silence alert opening and resolving.

``NOTIFIERS`` lists built-in names ("log", "mail_admins", "signal") or dotted paths of
``Notifier`` subclasses. Each is called once when an alert opens and once when it
resolves, after the alert's transaction committed. One that raises is logged and
skipped, so that a broken mail server never silences the log or the pager.

Notices say what the alert holds: the source, times, counts and rejection codes. Never
a secret, a header or a body.
"""

from __future__ import annotations

import logging
import textwrap
from datetime import datetime, timedelta

from django.core.mail import mail_admins
from django.dispatch import Signal
from rest_framework import serializers

from ..conf import app_settings
from ..core.hooks import hook_class
from ..inbound.models import RequestAudit, Verification
from ..outbound.catalog import webhook_event
from ..outbound.notices import ops_notice_enqueue
from ..presentation.admin_links import admin_url
from ..presentation.display import duration_text, iso, local_time
from ..signals import silence_alert_opened, silence_alert_resolved
from .models import SilenceAlert

logger = logging.getLogger(__name__)


class Notifier:
    """Subclass it, override both methods, and list its dotted path in NOTIFIERS.
    Instances are made with no arguments for each check."""

    def alert_opened(self, alert: SilenceAlert) -> None:
        """``alert.source`` has accepted no event for longer than its window."""

    def alert_resolved(self, alert: SilenceAlert) -> None:
        """Accepted events arrive again; ``alert.resolved_at`` is set."""


class LogNotifier(Notifier):
    """One line per notice on the ``webhook_receiver.watch.notifiers`` logger: ERROR when an
    alert opens, WARNING when it resolves (a recovery filtered out at INFO would leave
    whoever saw the ERROR waiting for it)."""

    def alert_opened(self, alert: SilenceAlert) -> None:
        logger.error("silence alert: %s", opened_line(alert), extra=_extra(alert))

    def alert_resolved(self, alert: SilenceAlert) -> None:
        logger.warning("silence over: %s", resolved_line(alert), extra=_extra(alert))


class MailAdminsNotifier(Notifier):
    """A mail to settings.ADMINS (``django.core.mail.mail_admins``) written for whoever
    reads it at 3 am: what it means, what we know, where to look."""

    def alert_opened(self, alert: SilenceAlert) -> None:
        mail_admins(opened_subject(alert), opened_body(alert), fail_silently=False)

    def alert_resolved(self, alert: SilenceAlert) -> None:
        mail_admins(resolved_subject(alert), resolved_body(alert), fail_silently=False)


class SignalNotifier(Notifier):
    """Sends ``silence_alert_opened`` / ``silence_alert_resolved`` (signals.py) with
    ``sender=SilenceAlert, alert=alert``: the place to connect a pager."""

    def alert_opened(self, alert: SilenceAlert) -> None:
        _send_robust(silence_alert_opened, alert)

    def alert_resolved(self, alert: SilenceAlert) -> None:
        _send_robust(silence_alert_resolved, alert)


class SilenceAlertNotice(serializers.Serializer):
    """Sent to OPS_DESTINATION when a source's silence alert opens or resolves."""

    # a field named as DRF's Field.source: the serializer's metaclass takes it as a field
    source = serializers.CharField()  # type: ignore[assignment]
    alert_id = serializers.IntegerField()
    summary = serializers.CharField()
    last_accepted_at = serializers.DateTimeField(allow_null=True)
    rejected = serializers.DictField(
        child=serializers.IntegerField(), help_text="Refusals by reason."
    )
    opened_at = serializers.DateTimeField()
    resolved_at = serializers.DateTimeField(allow_null=True)


_SILENCE_EXAMPLE = {
    "source": "shop",
    "alert_id": 12,
    "summary": "shop: nothing accepted for 15 minutes",
    "last_accepted_at": "2026-12-07T02:41:09+00:00",
    "rejected": {"signature": 3},
    "opened_at": "2026-12-07T02:56:09+00:00",
    "resolved_at": None,
}
webhook_event(
    "silence.alert_opened", serializer=SilenceAlertNotice, opt_in=True, example=_SILENCE_EXAMPLE
)
webhook_event(
    "silence.alert_resolved",
    serializer=SilenceAlertNotice,
    opt_in=True,
    description="Sent to OPS_DESTINATION when a source's silence alert resolves.",
    example=_SILENCE_EXAMPLE | {"resolved_at": "2026-12-07T03:02:40+00:00"},
)


class OutboxNotifier(Notifier):
    """Sends ``silence.alert_opened`` / ``silence.alert_resolved`` as webhooks to the
    OPS_DESTINATION through the outbox (one message per alert and state)."""

    def alert_opened(self, alert: SilenceAlert) -> None:
        self._send(alert, "opened", opened_line(alert))

    def alert_resolved(self, alert: SilenceAlert) -> None:
        self._send(alert, "resolved", resolved_line(alert))

    def _send(self, alert: SilenceAlert, state: str, summary: str) -> None:
        data = {
            "source": alert.source,
            "alert_id": alert.pk,
            "summary": summary,
            "last_accepted_at": iso(alert.last_accepted_at),
            "rejected": alert.rejected_counts,
            "opened_at": iso(alert.opened_at),
            "resolved_at": iso(alert.resolved_at),
        }
        key = f"silence:{alert.source}:{alert.pk}:{state}"
        ops_notice_enqueue(event_type=f"silence.alert_{state}", key=key, data=data)


BUILT_IN: dict[str, type[Notifier]] = {
    "log": LogNotifier,
    "mail_admins": MailAdminsNotifier,
    "signal": SignalNotifier,
    "outbox": OutboxNotifier,
}


def get_notifiers() -> list[Notifier]:
    """The notifiers NOTIFIERS names, in its order. Raises ``ImproperlyConfigured`` for
    a name that is neither built in nor the dotted path of a Notifier subclass."""
    expected = (
        f"a notifier. Use {', '.join(map(repr, BUILT_IN))}, or the dotted path of a "
        "webhook_receiver.watch.notifiers.Notifier subclass"
    )
    return [
        (BUILT_IN.get(name) or hook_class(name, Notifier, setting="NOTIFIERS", expected=expected))()
        for name in app_settings().notifiers
    ]


def _send_robust(signal: Signal, alert: SilenceAlert) -> None:
    for receiver, result in signal.send_robust(sender=SilenceAlert, alert=alert):
        if isinstance(result, Exception):
            logger.error(
                "receiver %r of a silence signal failed for %s",
                receiver,
                alert.source,
                exc_info=result,
                extra=_extra(alert),
            )


def _extra(alert: SilenceAlert) -> dict[str, object]:
    return {
        "webhook": {
            "source": alert.source,
            "silence_alert": alert.pk,
            "last_accepted_at": iso(alert.last_accepted_at),
            "rejected_total": alert.rejected_total,
        }
    }


# --- what a notice says ---------------------------------------------------------------

# what a run of rejections most likely means, for the person who reads the mail
HINTS = {
    Verification.INVALID_SIGNATURE: "the sender signs with a secret we do not hold: compare "
    "its signing secret with this source's SECRETS (a rotation on one side only?)",
    Verification.TIMESTAMP_OUT_OF_TOLERANCE: "signatures are too old or too new: a clock "
    "off on either side, or deliveries held back; see TOLERANCE_SECONDS",
    Verification.MISSING_HEADERS: "requests arrive without signature headers: another "
    "sender at this URL, or a proxy stripping headers",
    Verification.MALFORMED_HEADERS: "signature headers we cannot read: the source's SCHEME "
    "may not match what the sender sends",
    Verification.PAYLOAD_TOO_LARGE: "bodies over this source's MAX_BODY_BYTES",
}


def window(alert: SilenceAlert) -> str:
    return duration_text(timedelta(seconds=alert.silence_after_seconds))


def silent_for(alert: SilenceAlert, *, until: datetime | None = None) -> timedelta | None:
    """From the last accepted event to ``until`` (the event that ended the silence, the
    resolution, or the alert's opening). None when the source never accepted one."""
    if alert.last_accepted_at is None:
        return None
    end = until or alert.resolved_by_event_at or alert.resolved_at or alert.opened_at
    return end - alert.last_accepted_at


def rejected_summary(alert: SilenceAlert) -> str:
    """ "12 (invalid_signature: 10, timestamp_out_of_tolerance: 2)", or "none"."""
    if not alert.rejected_total:
        return "none"
    reasons = sorted(alert.rejected_counts.items(), key=lambda item: (-item[1], item[0]))
    return f"{alert.rejected_total} ({', '.join(f'{code}: {n}' for code, n in reasons)})"


def _silence(alert: SilenceAlert) -> str:
    silent = silent_for(alert, until=alert.opened_at)
    return duration_text(silent) if silent is not None else "ever"


def opened_line(alert: SilenceAlert) -> str:
    if alert.last_accepted_at is None:
        since = "has never accepted an event"
    else:
        since = f"silent since {local_time(alert.last_accepted_at)} ({_silence(alert)})"
    return (
        f"source {alert.source} {since}; window {window(alert)}; "
        f"refused in the last {window(alert)}: {rejected_summary(alert)}; alert #{alert.pk}"
    )


def resolved_line(alert: SilenceAlert) -> str:
    silent = silent_for(alert)
    after = f" after {duration_text(silent)}" if silent is not None else ""
    return (
        f"source {alert.source} accepts events again{after} (silent since "
        f"{local_time(alert.last_accepted_at)}, "
        f"event at {local_time(alert.resolved_by_event_at)}); "
        f"alert #{alert.pk}"
    )


def opened_subject(alert: SilenceAlert) -> str:
    if alert.last_accepted_at is None:
        return f"[webhook_receiver] {alert.source}: every request refused, no event accepted"
    return f"[webhook_receiver] {alert.source} silent for {_silence(alert)}"


def resolved_subject(alert: SilenceAlert) -> str:
    silent = silent_for(alert)
    after = f" after {duration_text(silent)}" if silent is not None else ""
    return f"[webhook_receiver] {alert.source} receiving again{after}"


def opened_body(alert: SilenceAlert) -> str:
    source, win = alert.source, window(alert)
    lines = [
        f"Webhook source {source!r} has accepted no event for longer than {win}.",
        "",
        "What it means: this sender normally posts events to us, and for longer than its",
        f"SILENCE_AFTER_SECONDS ({win}) none has been accepted. Either the sender stopped",
        "sending (an outage on its side, a webhook disabled or pointed elsewhere), or its",
        "requests reach us and are refused (a secret rotated on one side only, a clock",
        "off). Events it sends meanwhile are missing here until it redelivers them.",
        "",
        f"Last accepted event:  {local_time(alert.last_accepted_at)}",
        f"Silent for:           {_silence(alert)} when this alert opened",
        f"Alert opened:         {local_time(alert.opened_at)} (alert #{alert.pk})",
        f"Refused in the last {win}: {alert.rejected_total}",
    ]
    for code, count in sorted(alert.rejected_counts.items(), key=lambda i: (-i[1], i[0])):
        lines.append(f"  {code}: {count}")
        if code in HINTS:
            lines += textwrap.wrap(HINTS[code], 76, initial_indent="    ", subsequent_indent="    ")
    if alert.rejected_total:
        lines.append("  Requests do reach us: the fix is most likely in configuration.")
    else:
        lines.append("  (no request reached us at all: look at the sender's side first)")
    lines += ["", "Where to look:"]
    alerts = admin_url(SilenceAlert, source=source)
    audits = admin_url(RequestAudit, source=source)
    if alerts:
        lines.append(f"  - this alert, in the admin: {alerts}")
    if audits:
        lines.append(f"  - every request from {source}, accepted or refused: {audits}")
    lines += [
        "  - python manage.py webhook_status",
        "  - the sender's own delivery log or dashboard: failed deliveries, a disabled hook",
        "",
        "No more mail is sent while the silence lasts; one more comes when accepted",
        "events arrive again.",
    ]
    return "\n".join(lines) + "\n"


def resolved_body(alert: SilenceAlert) -> str:
    silent = silent_for(alert)
    lines = [
        f"Webhook source {alert.source!r} accepts events again: the silence alert "
        f"#{alert.pk} is resolved.",
        "",
        f"Silent since:         {local_time(alert.last_accepted_at)}",
        f"Accepted again:       {local_time(alert.resolved_by_event_at)}",
        f"Silent for:           {duration_text(silent) if silent is not None else 'unknown'}",
        f"Alert opened:         {local_time(alert.opened_at)}",
        f"Resolved:             {local_time(alert.resolved_at)}",
        "",
        "Events sent during the silence may still be missing: if the sender does not",
        "redeliver them on its own, reconciliation (python manage.py reconcile) lists",
        "what it sent that we do not hold.",
    ]
    return "\n".join(lines) + "\n"
