"""Every table of the app, imported from the room that owns it, so that Django finds them
(app label ``webhook_receiver``, migrations in ``migrations/``).

A host may import the models from here (``from webhook_receiver.models import
WebhookReceipt``); code inside the app imports them from its own room.
"""

from .inbound.models import (
    RECEIPT_RESULTS,
    RESOLUTIONS,
    FailedEvent,
    FailureStatus,
    RejectionTally,
    RequestAudit,
    Result,
    Verification,
    WebhookReceipt,
)
from .outbound.models import (
    DeliveryAttempt,
    MessageStatus,
    OutboxMessage,
    RecoveryJob,
    RecoveryKind,
    RecoveryState,
    WebhookDestination,
)
from .portal.models import Capability, PortalAction, PortalLink, PortalSession
from .reconcile.models import ReconciliationRun, RepairItem, RepairKind, RepairStatus, RunOutcome
from .sources.models import WebhookSource
from .watch.models import Heartbeat, SilenceAlert, SourceOverview

__all__ = [
    "RECEIPT_RESULTS",
    "RESOLUTIONS",
    "Capability",
    "DeliveryAttempt",
    "FailedEvent",
    "FailureStatus",
    "Heartbeat",
    "MessageStatus",
    "OutboxMessage",
    "PortalAction",
    "PortalLink",
    "PortalSession",
    "ReconciliationRun",
    "RecoveryJob",
    "RecoveryKind",
    "RecoveryState",
    "RejectionTally",
    "RepairItem",
    "RepairKind",
    "RepairStatus",
    "RequestAudit",
    "Result",
    "RunOutcome",
    "SilenceAlert",
    "SourceOverview",
    "Verification",
    "WebhookDestination",
    "WebhookReceipt",
    "WebhookSource",
]
