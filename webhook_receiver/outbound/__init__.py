"""Sending: this project's own webhooks leave through a transactional outbox.

``enqueue_webhook`` writes a message in the caller's transaction; the relay delivers it
after commit, at least once, under one stable key that the receiving end deduplicates
(``message_key`` builds one). ``@webhook_event`` declares a type of event in the
catalog (catalog.py).
"""

from .admission import Admission, destinations_for, enqueue_webhook, message_key
from .catalog import EventRefused, EventType, webhook_event
from .models import WebhookDestination

__all__ = [
    "Admission",
    "EventRefused",
    "EventType",
    "WebhookDestination",
    "destinations_for",
    "enqueue_webhook",
    "message_key",
    "webhook_event",
]
