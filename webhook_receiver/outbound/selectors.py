"""What the outbox's pages, status and metrics read: each destination's figures from one
grouped query, the failed messages holding others back, and the breaker's state.

Selectors only: nothing here writes. The admin's destinations page, the overview and
``webhook_status`` (watch/destinations.py) and the metrics' collector read the same figures
from here, so that they never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django.db.models import Count, Exists, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..core.encryption import SecretsUnreadable, stored_secrets_problem, with_stored_secrets
from .models import MessageStatus, OutboxMessage, WebhookDestination

# the backlog: what the relay still has to send
BACKLOG = (MessageStatus.PENDING, MessageStatus.SENDING)
# open: what holds back the later messages of its ordering key (the relay's rule)
OPEN = (*BACKLOG, MessageStatus.FAILED)


class Health(TypedDict):
    """The figures destinations_with_health() adds to each destination."""

    backlog: int
    oldest_eligible_at: datetime | None
    oldest_due_at: datetime | None
    failed_count: int
    in_flight: int
    sending: int
    leases_until: datetime | None
    held_back: int


if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    # a destination read through destinations_with_health(), its figures with it
    DestinationWithHealth = WithAnnotations[WebhookDestination, Health]


def destinations_with_health(
    queryset: QuerySet[WebhookDestination], *, now: datetime | None = None
) -> QuerySet[DestinationWithHealth]:
    """Each destination with its figures, one subquery each, run once per destination
    (a few index ranges however long the history):

    - ``backlog``: pending and sending messages (what the relay still has to send);
    - ``oldest_eligible_at``: the creation time of the oldest pending message that the
      relay would send now (due, and no older message of its ordering key open): how
      long the oldest sendable message has waited;
    - ``oldest_due_at``: the earliest due time among those same messages: how long the
      relay has had something to send (a retry's wait is not counted, its message's age
      is);
    - ``failed_count``: terminal messages waiting for an operator;
    - ``in_flight``: requests in flight on every worker (sending, their lease unexpired);
    - ``sending``, ``leases_until``: messages claimed and not yet recorded, and when the
      last of their leases runs out (expired or not): a worker that stopped holds its
      slots until then;
    - ``held_back``: pending and sending messages behind a failed one of their ordering
      key, which wait for an operator as it does.

    Only the three open statuses are read (the delivered and discarded history, the bulk
    of the table, never is), through the (destination, status, id) index; the ordering
    check, through the (destination, ordering key, id) index. No join and no GROUP BY
    over the destinations: grouped, PostgreSQL evaluated the held-back subquery once per
    open message, not once per destination (46 s for 20,000 open messages;
    docs/benchmarks.md).
    """
    now = now or timezone.now()
    # A message without an ordering key waits for none: said of the message itself, so
    # that PostgreSQL never looks for the older messages of an empty key (the relay's
    # claim says it the same way, queries.ELIGIBLE_IDS). Asked inside the subquery, on
    # statistics older than a backlog, the probe read every older keyless open message
    # of the destination for each one: 70 s for 20,000 (docs/benchmarks.md).
    sendable = OutboxMessage.objects.filter(
        Q(ordering_key="") | ~Exists(_older_in_line(OPEN)),
        destination=OuterRef("pk"),
        status=MessageStatus.PENDING,
        next_attempt_at__lte=now,
    )
    held_back = (
        OutboxMessage.objects.filter(destination=OuterRef("pk"), status__in=BACKLOG)
        .exclude(ordering_key="")
        .filter(Exists(_older_in_line([MessageStatus.FAILED])))
    )
    mine = OutboxMessage.objects.filter(destination=OuterRef("pk"))
    return queryset.annotate(
        backlog=_count(mine.filter(status__in=BACKLOG)),
        failed_count=_count(mine.filter(status=MessageStatus.FAILED)),
        in_flight=_count(mine.filter(status=MessageStatus.SENDING, lease_until__gt=now)),
        sending=_count(mine.filter(status=MessageStatus.SENDING)),
        leases_until=_least(mine.filter(status=MessageStatus.SENDING), Max("lease_until")),
        oldest_eligible_at=_least(sendable, Min("created_at")),
        oldest_due_at=_least(sendable, Min("next_attempt_at")),
        held_back=_count(held_back),
    )


def _count(messages: QuerySet[OutboxMessage]) -> Coalesce:
    """How many of ``messages`` (a subquery correlated to the outer destination)."""
    return Coalesce(_least(messages, Count("id")), 0)


def _least(messages: QuerySet[OutboxMessage], aggregate: Min | Max | Count) -> Subquery:
    """``aggregate`` over ``messages``, a subquery of one value (NULL: none)."""
    return Subquery(
        messages.order_by().values("destination").annotate(value=aggregate).values("value")
    )


def _older_in_line(statuses: Iterable[str]) -> QuerySet[OutboxMessage]:
    """For a message with an ordering key (the outer query's row): older messages of its
    destination and ordering key in one of ``statuses``. The key said not empty here too
    lets PostgreSQL probe the partial index of open messages with a key
    (``webhook_outbox_open_ordering``)."""
    return OutboxMessage.objects.filter(
        destination_id=OuterRef("destination_id"),
        ordering_key=OuterRef("ordering_key"),
        id__lt=OuterRef("id"),
        status__in=list(statuses),
    ).exclude(ordering_key="")


def failed_holding_back(destination_ids: Iterable[int]) -> dict[int, tuple[int, OutboxMessage]]:
    """Per destination: how many failed messages hold back later messages of their
    ordering key, and the oldest of them (to link to)."""
    later_open = OutboxMessage.objects.filter(
        destination_id=OuterRef("destination_id"),
        ordering_key=OuterRef("ordering_key"),
        id__gt=OuterRef("id"),
        status__in=BACKLOG,
    )
    holders = (
        OutboxMessage.objects.filter(
            destination_id__in=list(destination_ids), status=MessageStatus.FAILED
        )
        .exclude(ordering_key="")
        .filter(Exists(later_open))
        .order_by("id")
        .only("id", "destination_id", "key", "ordering_key")
    )
    found: dict[int, tuple[int, OutboxMessage]] = {}
    for message in holders:
        count, oldest = found.get(message.destination_id, (0, message))
        found[message.destination_id] = (count + 1, oldest)
    return found


def destinations_unreadable(
    *, using: str = "default", keys: Sequence[str] | None = None
) -> list[tuple[int, str, SecretsUnreadable]]:
    """The destinations whose secrets ``keys`` (those set, by default) cannot decrypt:
    (id, name, why), by id. Reads the column as stored, so a bad row is found, not
    raised."""
    rows = with_stored_secrets(WebhookDestination.objects.using(using).order_by("pk"))
    found = []
    for pk, name, *stored in rows.values_list("pk", "name", "stored_secrets", "stored_retiring"):
        problems = (stored_secrets_problem(column, keys) for column in stored)
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            found.append((pk, name, problem))
    return found
