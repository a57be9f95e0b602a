"""Signals for observers of the receiver: connect a pager, a chat message, a metric.

Both are sent by the "signal" notifier (NOTIFIERS), after the alert's transaction
committed, with ``sender=SilenceAlert`` and ``alert=<the SilenceAlert>``. A receiver
that raises is logged and does not keep the other receivers from hearing it.

    from django.dispatch import receiver
    from webhook_receiver.signals import silence_alert_opened

    @receiver(silence_alert_opened)
    def page_someone(sender, alert, **kwargs):
        pager.trigger(f"webhooks from {alert.source} stopped", dedup_key=f"silence-{alert.pk}")
"""

from __future__ import annotations

from django.dispatch import Signal

# a source has accepted no event for longer than its SILENCE_AFTER_SECONDS: once per incident
silence_alert_opened = Signal()
# accepted events arrive again: once per incident, after silence_alert_opened
silence_alert_resolved = Signal()
