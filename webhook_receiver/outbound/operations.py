"""What an operator does to the outbox, from the admin or a command: retry messages now,
discard them (a destination's recovery is a recovery job: recovery.py), enable a
destination again (one the relay retired: retirement.py) or disable it,
re-encrypt the destinations' secrets after a key rotation (the figures the
destinations page shows are read by outbound/selectors.py).

Each service is one short transaction that records who acted (on the message, in the
log), and wakes the relays for each destination it touched once that transaction has
committed. Each takes a ``scope`` (tenancy.py): what it may reach, one tenant's records
or every tenant's; an id outside it is not found.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..core.encryption import SecretsNotDecrypted
from .models import MessageStatus, WebhookDestination
from .relay.wakeups import relay_wake_on_commit
from .tenancy import Scope

logger = logging.getLogger(__name__)

# Retry now: a failed message (terminal, waiting for an operator) or a pending one
# waiting out its backoff. Not a discarded one: it no longer holds back the messages
# behind it in its ordering key, so they may have been delivered since, and sending it
# now would deliver out of order. Not a sending one: a worker holds its lease.
RETRYABLE = (MessageStatus.PENDING, MessageStatus.FAILED)
# Discard: what is still to be sent. Delivered and sending messages are left alone.
DISCARDABLE = (MessageStatus.PENDING, MessageStatus.FAILED)


def message_retry_now(
    *, scope: Scope, message_ids: Iterable[int], by: str, now: datetime | None = None
) -> list[int]:
    """Make the given failed or pending messages eligible now, and queue their
    destinations' relay runs. Returns the ids of those changed, in order; the others
    are left as they are.

    Each becomes pending with ``next_attempt_at`` now and no lease, and its ``failures``
    go back to 0: the retry budget (the destination's ``max_attempts``) starts again, so
    a message that had spent it gets the whole policy once more. ``attempts`` keeps
    counting, so the attempt history goes on from where it was. A destination whose
    breaker is open still waits for its cool-down (a recovery job of its failed
    messages ends it), and a disabled one sends nothing.
    """
    now = now or timezone.now()
    changes = {
        "status": MessageStatus.PENDING,
        "next_attempt_at": now,
        "lease_until": None,
        "failures": 0,
    }
    return _messages_change(scope, message_ids, RETRYABLE, changes, by=by, done="retried")


def message_discard(
    *,
    scope: Scope,
    message_ids: Iterable[int],
    by: str,
    reason: str,
    now: datetime | None = None,
) -> list[int]:
    """Give up on the given pending or failed messages, with a reason on record: they are
    never sent. Returns the ids of those changed, in order; the others (delivered,
    sending, already discarded) are left as they are.

    Each keeps ``discarded_by``, ``discarded_at`` and ``discard_reason`` (and its
    ``next_attempt_at`` becomes that moment too, as the relay does for a delivered or
    failed message). Discarding a failed message frees the
    messages queued behind it in its ordering key, so their relay run is queued too.
    """
    reason = reason.strip()
    if not reason:
        raise ValueError("Discarding outbox messages needs a reason.")
    now = now or timezone.now()
    changes = {
        "status": MessageStatus.DISCARDED,
        "next_attempt_at": now,
        "lease_until": None,
        "discarded_by": by[:150],
        "discarded_at": now,
        "discard_reason": reason,
    }
    return _messages_change(scope, message_ids, DISCARDABLE, changes, by=by, done="discarded")


def _messages_change(
    scope: Scope,
    message_ids: Iterable[int],
    statuses: tuple[str, ...],
    changes: dict[str, Any],
    *,
    by: str,
    done: str,
) -> list[int]:
    """Apply ``changes`` to those of the messages whose status is one of ``statuses``,
    in one short transaction, and queue their destinations' relay runs on commit.
    Returns the ids changed, in order."""
    with transaction.atomic():
        # locked in id order, so two operators' overlapping selections cannot deadlock
        rows = list(
            scope.messages()
            .select_for_update(of=("self",))
            .filter(pk__in=list(message_ids), status__in=statuses)
            .order_by("id")
            .values_list("id", "destination_id")
        )
        ids = [i for i, _ in rows]
        scope.messages().filter(pk__in=ids).update(**changes)
        relay_wake_on_commit({d for _, d in rows})
    if ids:
        logger.info(
            "outbox: %s %s %d message(s)",
            by,
            done,
            len(ids),
            extra={"by": by, "message_ids": ids},
        )
    return ids


def destination_enable(
    *, scope: Scope, destination: WebhookDestination | int, by: str, now: datetime | None = None
) -> int | None:
    """Enable a disabled destination (by an operator, or retired by the relay: a 410, a
    failing span): its held messages are sent again, in their order (oldest first, each
    ordering key in turn), as their retry times come; its retirement's reason and
    failing span are forgotten, and an open breaker is ended. Returns how many messages
    it holds to send (None: it was enabled already); WebhookDestination.DoesNotExist
    when the scope holds no such destination."""
    now = now or timezone.now()
    destination_id = destination if isinstance(destination, int) else destination.pk
    with transaction.atomic():
        dest = scope.destinations().select_for_update().get(pk=destination_id)
        if dest.enabled:
            return None
        reason = dest.disabled_reason
        scope.destinations().filter(pk=dest.pk).update(
            enabled=True,
            disabled_reason="",
            disabled_at=None,
            failing_since=None,
            failing_warned_at=None,
            paused_until=None,
            updated_at=now,
        )
        held = (
            scope.messages()
            .filter(
                destination_id=dest.pk, status__in=(MessageStatus.PENDING, MessageStatus.SENDING)
            )
            .count()
        )
        relay_wake_on_commit({dest.pk})
    logger.info(
        "outbox: %s enabled %s (%s); %d message(s) to send",
        by,
        dest.name,
        f"disabled by the relay: {reason}" if reason else "disabled",
        held,
        extra={"by": by, "destination": dest.name},
    )
    return held


def destination_disable(
    *, scope: Scope, destination: WebhookDestination | int, by: str, now: datetime | None = None
) -> bool:
    """Disable a destination: nothing more is admitted to it, and its messages are held
    pending until it is enabled again (or discarded). Returns False when it was
    disabled already; WebhookDestination.DoesNotExist when the scope holds no such
    destination."""
    now = now or timezone.now()
    destination_id = destination if isinstance(destination, int) else destination.pk
    with transaction.atomic():
        dest = scope.destinations().select_for_update().only("id", "name").get(pk=destination_id)
        changed = (
            scope.destinations()
            .filter(pk=dest.pk, enabled=True)
            .update(enabled=False, disabled_reason="", disabled_at=now, updated_at=now)
        )
    if changed:
        logger.info(
            "outbox: %s disabled destination %s",
            by,
            dest.name,
            extra={"by": by, "destination_id": destination_id},
        )
    return bool(changed)


# a destination's encrypted columns: its secrets, and a rotation's outgoing ones
SECRET_COLUMNS = ["secrets", "retiring_secrets"]


def destinations_reencrypt() -> tuple[int, list[str]]:  # the staff's: every tenant's
    """Encrypt every destination's secrets again, under the first key: after a new key
    was put first, so that the old one can be removed. One short transaction per
    destination, its row locked as the relay's claim locks it; only the secrets columns
    are written. Returns how many destinations it rewrote, and the names of those whose
    secrets no key decrypts (left as they are: new secrets, or their key, fix them)."""
    done, unreadable = 0, []
    for pk, name in WebhookDestination.objects.order_by("pk").values_list("pk", "name"):
        try:
            with transaction.atomic():
                dest = (
                    WebhookDestination.objects.select_for_update()
                    .only("id", *SECRET_COLUMNS)
                    .get(pk=pk)
                )
                # read by any key, written by the first
                dest.save(update_fields=SECRET_COLUMNS)
        except SecretsNotDecrypted:
            unreadable.append(name)
            continue
        done += 1
    return done, unreadable
