"""What wakes a relay's lanes (engine.py decides when each runs; this is what it hears).

- **An admission**, at once: on PostgreSQL the message's INSERT also sends
  ``pg_notify('webhook_receiver_outbox', '<destination id>')`` (queries.INSERT_MESSAGE),
  which PostgreSQL delivers when, and only if, the admitting transaction commits; a
  relay that ``LISTEN``s wakes that destination's lane. An operator's retry, recovery or
  enable sends the same (``relay_wake_on_commit``). The listener holds one connection of
  its own, straight to PostgreSQL (``RELAY_LISTEN``): behind PgBouncer in transaction
  mode a notification cannot reach a session, so there the poll does it alone.
- **The poll**, every ``RELAY_POLL_SECONDS``: the destinations with a message due now
  (``due_destinations``), which finds whatever no notification reached: SQLite's
  admissions, a lost notification, a retry whose backoff ended, a Retry-After that
  passed, a lease that ran out, a breaker's pause that ended. A relay that was down
  finds all of it at its first poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.utils import timezone

from ...core import bounds
from ..models import MessageStatus

logger = logging.getLogger(__name__)

# the channel admissions notify and relays listen on; the payload is a destination's id
CHANNEL = "webhook_receiver_outbox"
# how long a lost listener waits before it connects again (doubling up to the last)
LISTEN_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)

PENDING = MessageStatus.PENDING.value
SENDING = MessageStatus.SENDING.value
FAILED = MessageStatus.FAILED.value

# The enabled destinations, not paused, with a free slot (requests in flight, the
# unexpired leases on every relay, fewer than its max_in_flight) and a message the claim
# would take now: pending and due, or sending under a lease that ran out, and not waiting
# for an older open message of its ordering key. Waking a destination whose claim would
# take nothing costs a round each poll: a failed head of an order holds the rest, and a
# dead relay's leases hold the slots until they run out (a live relay's answers free its
# slots, and its own rounds claim what replaces them). A few probes of the open-messages
# index a destination. The pause and the slots are said again here because the poll
# filters every destination at once; it only wakes lanes: what a lane may claim is
# decided by its round (breaker.py, limits.py), so a filter that is wider costs a round.
DUE_DESTINATIONS = f"""
    SELECT d.id FROM webhook_receiver_webhookdestination d
    WHERE d.enabled AND (d.paused_until IS NULL OR d.paused_until <= %(now)s)
      AND (SELECT count(*) FROM webhook_receiver_outboxmessage f
           WHERE f.destination_id = d.id AND f.status = '{SENDING}'
             AND f.lease_until > %(now)s) < d.max_in_flight
      AND EXISTS (
        SELECT 1 FROM webhook_receiver_outboxmessage m
        WHERE m.destination_id = d.id AND m.status IN ('{PENDING}', '{SENDING}')
          AND ((m.status = '{PENDING}' AND m.next_attempt_at <= %(now)s)
               OR (m.status = '{SENDING}' AND m.lease_until <= %(now)s))
          AND (m.ordering_key = '' OR NOT EXISTS (
                SELECT 1 FROM webhook_receiver_outboxmessage o
                WHERE o.destination_id = m.destination_id AND o.ordering_key = m.ordering_key
                  AND o.id < m.id AND o.status IN ('{PENDING}', '{SENDING}', '{FAILED}'))))
    ORDER BY d.id
"""


def due_destinations() -> list[int]:
    """The destinations the poll wakes (DUE_DESTINATIONS), under the statement bounds."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with bounds.bounded_transaction(), connection.cursor() as cursor:
        cursor.execute(DUE_DESTINATIONS, {"now": now})
        return [row[0] for row in cursor.fetchall()]


def relay_wake_on_commit(destination_ids: set[int]) -> None:
    """Wake the relays for these destinations when the transaction commits (an
    operator's retry, discard or recovery, an enable): a notification on PostgreSQL,
    sent in the transaction (PostgreSQL holds it until the commit); elsewhere the poll
    finds them within RELAY_POLL_SECONDS."""
    if connection.vendor != "postgresql" or not destination_ids:
        return
    with connection.cursor() as cursor:
        for destination_id in sorted(destination_ids):
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(destination_id)])


def listen_params() -> dict[str, Any]:
    """The listener's connection parameters: the default database's, as Django connects
    (its own cursor class and adapters left out: the listener runs no query of Django's)."""
    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return params


async def listen(params: dict[str, Any], wake: Callable[[int], None], stop: asyncio.Event) -> None:
    """LISTEN on CHANNEL with a connection of its own (``params``: psycopg's connection
    parameters), waking a destination's lane for each notification, until ``stop``. A
    lost connection is made again (one WARNING line when it is lost, one INFO when it
    is back); the poll covers the gap."""
    import psycopg

    retries = 0
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                if retries:
                    logger.info("outbox: the relay listens for admissions again")
                retries = 0
                while not stop.is_set():
                    # a second at a time, so that a stop is seen
                    async for notice in conn.notifies(timeout=1.0):
                        if notice.payload.isdigit():
                            wake(int(notice.payload))
        except (psycopg.Error, OSError) as exc:
            if retries == 0:
                logger.warning(
                    "outbox: the relay's listener lost its connection (%s: %s); the poll "
                    "finds admissions meanwhile",
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
            wait = LISTEN_RETRY_SECONDS[min(retries, len(LISTEN_RETRY_SECONDS) - 1)]
            retries += 1
            try:
                async with asyncio.timeout(wait):
                    await stop.wait()
            except TimeoutError:
                pass
