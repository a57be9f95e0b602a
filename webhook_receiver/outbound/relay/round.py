"""A relay round: for any number of destinations at once, record the answers that came
and claim what the limits allow now, in one short transaction.

1. Lock and read the destinations' rows (``queries.DESTINATIONS_LOCKED``: ``FOR UPDATE
   SKIP LOCKED`` on PostgreSQL, so that a destination another relay is claiming for is
   left to it this round; SQLite's IMMEDIATE transaction serialises every writer).
2. Decide in Python, from the rows as locked and the answers: each answer's verdict
   (policy.py), the breaker (../breaker.py), the failing span and retirement after
   them, the bucket refilled, and how many messages each claim may take (limits.py).
3. Write what was decided and claim, in one statement on PostgreSQL (``queries.ROUND``):
   each answer's verdict on its message (only where this claim still holds it), an
   attempt row each, the requests in flight counted under the lock (the unexpired
   leases on every relay), the eligible messages leased oldest first (``FOR UPDATE SKIP
   LOCKED``; a message waits for an older open one of its ordering key), and each row
   written back once. On SQLite, the same parts, a statement each.

So a round costs two statements on PostgreSQL whatever the number of destinations in
it, and every statement is bounded by the lock and statement timeouts. The side effects
(the ops notices of terminal answers, in the round's transaction; the counters and log
lines once it commits) are the round's too.

A round the database refuses, and one destination's claim or record taken as a round of
its own: steps.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from ...core import bounds
from ...core.encryption import SecretsUnreadable
from .. import queries
from ..models import MessageStatus, WebhookDestination
from .limits import TOKEN_EPSILON, After, after_answers, allowance, token_wait
from .messages import Claimed, Work
from .policy import decide
from .reporting import round_reported
from .rows import Rows, destinations_locked
from .writes import Plan, Written, write

# messages a destination's claim takes in one round at most
CLAIM_BATCH = 10


@dataclass(frozen=True)
class Outcome:
    """What a round did for one destination."""

    destination_id: int
    # the row as the round locked it (None: another relay holds it, or there is none)
    destination: WebhookDestination | None = None
    claimed: list[Claimed] = field(default_factory=list)
    # messages its claim failed instead of sending: a lease ran out (an attempt never
    # recorded) and that spent the last of the budget
    spent: list[Claimed] = field(default_factory=list)
    # the messages whose answers it recorded (an answer whose lease ran out, and whose
    # message another claim took, is not among them: its attempt row is kept all the same)
    recorded: frozenset[int] = frozenset()
    # another relay held the row: nothing was done, the answers are to be given again
    busy: bool = False
    # no such destination
    missing: bool = False
    # it may be claimed for now (enabled, not paused); else until when it is paused
    open: bool = False
    paused_until: datetime | None = None
    # out of tokens: seconds until a claim is worth making again
    wait: float | None = None
    # its claim took all its limits allowed: more may be eligible (its next round claims)
    more: bool = False
    # its secrets no key decrypts: nothing is claimed for it (its answers are recorded)
    unreadable: SecretsUnreadable | None = None
    # what its answers did to its breaker and retirement
    after: After | None = None


def relay_round(
    work: Sequence[Work], *, now: datetime | None = None, rows: Rows | None = None
) -> dict[int, Outcome]:
    """Record and claim for every destination in ``work``, in one transaction (the
    module's docstring). ``rows``: the relay's rows (rows.py), from which a destination
    it read before is decided and written in one statement, guarded by its version; the
    others are read under lock first. A failure of the database propagates (the caller
    keeps the answers, or leaves them to their leases)."""
    now = now or timezone.now()
    work = _merged(work)
    outcomes: dict[int, Outcome] = {}
    with bounds.bounded_transaction():
        fresh = list(work)
        if rows is not None and connection.vendor == "postgresql":
            kept = [(w, rows.get(w.destination_id)) for w in work]
            plans = [_plan(w, *row, now) for w, row in kept if row is not None]
            fresh = [w for w, row in kept if row is None]
            if plans:
                written = write(plans, now, guarded=True)
                for plan in plans:
                    if plan.dest.pk in written.versions:
                        outcomes[plan.dest.pk] = _finished(plan, written, now, rows)
                    else:  # its row changed since, or another relay holds it
                        rows.forget(plan.dest.pk)
                        fresh.append(plan.work)
        if fresh:
            locked = destinations_locked([w.destination_id for w in fresh])
            plans = []
            for w in fresh:
                row = locked.get(w.destination_id)
                if row is None:
                    outcomes[w.destination_id] = Outcome(w.destination_id, busy=True)
                else:
                    plans.append(_plan(w, row[0], None, row[1], now))
            if len(locked) < len(fresh):
                _mark_missing(outcomes)
            written = write(plans, now, guarded=False)
            for plan in plans:
                outcomes[plan.dest.pk] = _finished(plan, written, now, rows)
    return outcomes


def _plan(
    work: Work,
    dest: WebhookDestination,
    version: str | None,
    unreadable: SecretsUnreadable | None,
    now: datetime,
) -> Plan:
    """What the limits decide for ``work`` from the row ``dest``."""
    verdicts = [decide(dest, sent, now) for sent in work.answers]
    after = after_answers(dest, verdicts, now)
    claim = 0 if unreadable is not None else work.claim
    return Plan(
        dest, version, work, verdicts, after, allowance(dest, after, now, claim), unreadable
    )


def _finished(plan: Plan, written: Written, now: datetime, rows: Rows | None) -> Outcome:
    """The outcome of a plan the round carried out: reported, and its row kept as the
    round left it."""
    outcome = _outcome(plan, written, now)
    round_reported(
        plan.dest,
        plan.work.answers,
        plan.verdicts,
        outcome.recorded,
        outcome.spent,
        plan.after,
        now,
    )
    version = written.versions.get(plan.dest.pk) or getattr(plan.dest, "row_version", "")
    if rows is not None and version:
        rows.keep(_as_left(plan, written), version, plan.unreadable)
    return outcome


def _as_left(plan: Plan, written: Written) -> WebhookDestination:
    """The row as the round left it: what it wrote, if it wrote it."""
    dest = plan.dest
    if dest.pk not in written.tokens:
        return dest
    after = plan.after
    dest.tokens = written.tokens[dest.pk]
    if plan.allow.allowed:
        dest.tokens_at = plan.allow.tokens_at
    for column in queries.STATE_WRITTEN:
        setattr(dest, column, getattr(after, column))
    return dest


def _merged(work: Sequence[Work]) -> list[Work]:
    """One Work per destination, in id order (the order rows are locked in)."""
    by_id: dict[int, Work] = {}
    for w in work:
        seen = by_id.get(w.destination_id)
        by_id[w.destination_id] = (
            w
            if seen is None
            else Work(w.destination_id, [*seen.answers, *w.answers], max(seen.claim, w.claim))
        )
    return [by_id[key] for key in sorted(by_id)]


def _mark_missing(outcomes: dict[int, Outcome]) -> None:
    """Of the rows the lock did not return, those that do not exist (no other relay
    holds them)."""
    busy = [key for key, outcome in outcomes.items() if outcome.busy]
    if not busy:
        return
    existing = set(WebhookDestination.objects.filter(pk__in=busy).values_list("pk", flat=True))
    for key in busy:
        if key not in existing:
            outcomes[key] = Outcome(key, missing=True)


# --- what the round did --------------------------------------------------------------


def _outcome(plan: Plan, written: Written, now: datetime) -> Outcome:
    dest, allow = plan.dest, plan.allow
    rows = written.claimed.get(dest.pk, [])
    claimed = [_claimed(m, now) for m in rows if m["status"] != MessageStatus.FAILED]
    spent = [_claimed(m, now) for m in rows if m["status"] == MessageStatus.FAILED]
    tokens_left = written.tokens.get(dest.pk, allow.tokens)
    wait = None
    slots = written.slots.get(dest.pk)  # None: not counted (its bucket allowed nothing)
    taken = min(allow.allowed, slots) if slots is not None else allow.allowed
    # the bucket stopped the claim (not the slots, nor a lack of eligible messages)
    bucket_short = (
        allow.allowed < plan.work.claim
        and len(rows) >= allow.allowed
        and (slots is None or slots > len(claimed))
    )
    # or the claim took all it could and spent the bucket: the next claim waits for its
    # tokens (and the answers that come meanwhile are recorded with it: engine.py)
    bucket_spent = 0 < taken <= len(rows) and tokens_left + TOKEN_EPSILON < 1
    if allow.open and (bucket_short or bucket_spent):
        wait = token_wait(dest, tokens_left, plan.work.claim)
    # it took all its limits allowed: more may be eligible once answers free its slots
    more = bool(rows) and len(rows) >= taken and wait is None
    recorded = written.recorded & {sent.message.id for sent in plan.work.answers}
    return Outcome(
        dest.pk,
        destination=dest,
        claimed=claimed,
        spent=spent,
        recorded=frozenset(recorded),
        open=allow.open,
        paused_until=allow.paused_until,
        wait=wait,
        more=more,
        unreadable=plan.unreadable,
        after=plan.after,
    )


def _claimed(m: dict[str, Any], claimed_at: datetime) -> Claimed:
    created = m["created_at"]
    if isinstance(created, str):  # JSON's text (PostgreSQL), or SQLite's
        created = datetime.fromisoformat(created)
    if timezone.is_naive(created):  # SQLite keeps UTC without its offset
        created = created.replace(tzinfo=UTC)
    return Claimed(
        id=m["id"],
        key=m["key"],
        event_type=m["event_type"],
        payload=json.loads(m["payload"]) if isinstance(m["payload"], str) else m["payload"],
        attempt=m["attempts"],
        failures=m["failures"],
        created_at=created,
        traceparent=m["traceparent"] or "",
        claimed_at=claimed_at,
    )
