"""A relay round: for any number of destinations at once, record the answers that came
and claim what the limits allow now, in one short transaction.

1. Lock and read the destinations' rows (``queries.DESTINATIONS_LOCKED``: ``FOR UPDATE
   SKIP LOCKED`` on PostgreSQL, so that a destination another relay is claiming for is
   left to it this round; SQLite's IMMEDIATE transaction serialises every writer).
2. Decide in Python, from the rows as locked and the answers: each answer's verdict
   (policy.py), the breaker, the failing span and retirement after them, the bucket
   refilled, and how many messages each claim may take (limits.py).
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
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from ...conf import app_settings
from ...core import bounds
from .. import queries
from ..encryption import SecretsUnreadable
from ..models import MessageStatus, WebhookDestination
from .limits import After, Allowance, after_answers, allowance, token_wait
from .messages import Claimed, Sent
from .policy import Decision, decide
from .reporting import round_reported
from .rows import Rows, destinations_locked

# messages a destination's claim takes in one round at most
CLAIM_BATCH = 10
# a lease outlives the request's own timeout by lease_margin(); this much when the
# statements are not bounded (LOCK_TIMEOUT_MS or STATEMENT_TIMEOUT_MS of 0)
LEASE_MARGIN = timedelta(seconds=30)
# the relay's own work between an answer and its record's statement (a GC pause, the
# loop busy with other destinations), beyond the statements' bounds
RECORD_SLACK = timedelta(seconds=3)
# the last error of a message whose unrecorded attempt spent its budget
UNRECORDED = (
    "its last attempt was never recorded (the relay stopped, or the database refused "
    "its answer), and that spent its retry budget"
)


@dataclass(frozen=True)
class Work:
    """One destination's part of a round: the answers that came, and how many messages
    its claim may take at most (0: record only)."""

    destination_id: int
    answers: Sequence[Sent] = ()
    claim: int = 0


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


@dataclass
class _Plan:
    dest: WebhookDestination
    # the row's version the plan was decided from (None: read under lock in this round)
    version: str | None
    work: Work
    verdicts: list[Decision]
    after: After
    allow: Allowance
    unreadable: SecretsUnreadable | None


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
                written = _write(plans, now, guarded=True)
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
            written = _write(plans, now, guarded=False)
            for plan in plans:
                outcomes[plan.dest.pk] = _finished(plan, written, now, rows)
    return outcomes


def _plan(
    work: Work,
    dest: WebhookDestination,
    version: str | None,
    unreadable: SecretsUnreadable | None,
    now: datetime,
) -> _Plan:
    """What the limits decide for ``work`` from the row ``dest``."""
    verdicts = [decide(dest, sent, now) for sent in work.answers]
    after = after_answers(dest, verdicts, now)
    claim = 0 if unreadable is not None else work.claim
    return _Plan(
        dest, version, work, verdicts, after, allowance(dest, after, now, claim), unreadable
    )


def _finished(plan: _Plan, written: _Written, now: datetime, rows: Rows | None) -> Outcome:
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


def _as_left(plan: _Plan, written: _Written) -> WebhookDestination:
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


# --- the write -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Written:
    claimed: dict[int, list[dict[str, Any]]]
    recorded: frozenset[int]
    # per destination: the requests it may still start (its free slots), and the bucket
    # as written (only where the row was written)
    slots: dict[int, int]
    tokens: dict[int, float]
    # the destinations the statement held, and each row's version after it
    versions: dict[int, str]


def _write(plans: list[_Plan], now: datetime, *, guarded: bool) -> _Written:
    """The plans written and their claims made; ``guarded``: each only if its row is
    still the version it was decided from (``versions`` names those it was). A plan
    with nothing to write nor claim costs no statement, unless it is guarded: then the
    statement tells whether its row changed (an operator's recovery that ended a pause
    the kept row still has)."""
    if not guarded and not any(plan.work.answers or plan.allow.allowed for plan in plans):
        # nothing to record, nothing its limits allow now (paused, out of tokens)
        versions = {plan.dest.pk: getattr(plan.dest, "row_version", "") for plan in plans}
        return _Written({}, frozenset(), {}, {}, versions)
    if connection.vendor == "postgresql":
        return _write_postgresql(plans, now, guarded=guarded)
    return _write_sqlite(plans, now)


def _answer_row(destination_id: int, sent: Sent, v: Decision, now: datetime) -> dict[str, Any]:
    """One answer as the statement takes it (``queries.ANSWER_COLUMNS``)."""
    adapt = connection.ops.adapt_datetimefield_value
    m = sent.message
    delivered = v.status == MessageStatus.DELIVERED
    return {
        "destination_id": destination_id,
        "message_id": m.id,
        "attempt": m.attempt,
        "status": str(v.status),
        "failures": m.failures + (1 if v.spends_budget else 0),
        "next_attempt_at": adapt(v.next_attempt_at or now),
        "delivered_at": adapt(now if delivered else None),
        "status_code": sent.status_code,
        "last_error": sent.error or ("" if delivered else sent.excerpt),
        "started_at": adapt(sent.started_at),
        "duration_ms": sent.duration_ms,
        "error": sent.error,
        "excerpt": sent.excerpt,
        "attempt_next_at": adapt(v.next_attempt_at),
    }


def _state_row(plan: _Plan, now: datetime) -> dict[str, Any]:
    """One destination's decisions as the statement takes them (``queries.STATE_TYPES``)."""
    adapt = connection.ops.adapt_datetimefield_value
    dest, after, allow = plan.dest, plan.after, plan.allow
    return {
        "id": dest.pk,
        "version": plan.version,
        "counted": after.counted,
        "allowed": allow.allowed,
        "probe": allow.probe,
        "max_in_flight": dest.max_in_flight,
        "max_attempts": dest.max_attempts,
        "lease_until": adapt(now + timedelta(seconds=dest.timeout_seconds) + lease_margin()),
        "tokens": allow.tokens,
        "tokens_at": adapt(allow.tokens_at),
        "consecutive_failures": after.consecutive_failures,
        "paused_until": adapt(after.paused_until),
        "last_success_at": adapt(after.last_success_at),
        "last_failure_at": adapt(after.last_failure_at),
        "failing_since": adapt(after.failing_since),
        "failing_warned_at": adapt(after.failing_warned_at),
        "enabled": after.enabled,
        "disabled_reason": after.disabled_reason,
        "disabled_at": adapt(after.disabled_at),
    }


def _write_postgresql(plans: list[_Plan], now: datetime, *, guarded: bool) -> _Written:
    answers = [
        _answer_row(plan.dest.pk, sent, v, now)
        for plan in plans
        for sent, v in zip(plan.work.answers, plan.verdicts, strict=True)
    ]
    # a row each plan holds in the statement (its answers are recorded only where its
    # destination is held: ``locked``)
    states = [
        _state_row(plan, now)
        for plan in plans
        if guarded or plan.work.answers or plan.after.counted or plan.allow.allowed
    ]
    params: dict[str, Any] = {
        "answers": json.dumps(answers, default=datetime.isoformat),
        "states": json.dumps(states, default=datetime.isoformat),
        "now": now,
        "unrecorded": UNRECORDED,
    }
    with connection.cursor() as cursor:
        cursor.execute(queries.round_statement(), params)
        claimed_json, recorded, locked_json, slots_json, tokens_json = cursor.fetchone()
    claimed: dict[int, list[dict[str, Any]]] = {}
    for row in json.loads(claimed_json) if claimed_json else []:
        claimed.setdefault(row["destination_id"], []).append(row)
    versions = {key: value for key, value in json.loads(locked_json or "[]")}
    if not guarded:
        # a plan left out of the statement (nothing to do) holds its row all the same
        for plan in plans:
            versions.setdefault(plan.dest.pk, getattr(plan.dest, "row_version", ""))
    return _Written(
        claimed,
        frozenset(recorded),
        {key: value for key, value in json.loads(slots_json or "[]")},
        {key: value for key, value in json.loads(tokens_json or "[]")},
        versions,
    )


def _write_sqlite(plans: list[_Plan], now: datetime) -> _Written:
    """SQLite: the same parts, a statement each, in the round's IMMEDIATE transaction
    (the record's first: a claim then sees what it recorded)."""
    adapt = connection.ops.adapt_datetimefield_value
    rows = [
        _answer_row(plan.dest.pk, sent, v, now)
        for plan in plans
        for sent, v in zip(plan.work.answers, plan.verdicts, strict=True)
    ]
    recorded: set[int] = set()
    claimed: dict[int, list[dict[str, Any]]] = {}
    slots: dict[int, int] = {}
    tokens: dict[int, float] = {}
    with connection.cursor() as cursor:
        if rows:
            marks = ", ".join(
                "(" + ", ".join(f"%(a{n}_{c})s" for c in queries.ANSWER_COLUMNS) + ")"
                for n in range(len(rows))
            )
            values = {
                f"a{n}_{c}": row[c] for n, row in enumerate(rows) for c in queries.ANSWER_COLUMNS
            }
            answered = queries.ANSWERS_SQLITE.format(rows=marks)
            cursor.execute(f"{answered} {queries.RECORD_MESSAGES_SQLITE}", values)
            recorded = {row[0] for row in cursor.fetchall()}
            cursor.execute(f"{answered} {queries.RECORD_ATTEMPTS}", values)
        for plan in plans:
            dest, allow = plan.dest, plan.allow
            taken: list[dict[str, Any]] = []
            if allow.allowed:
                cursor.execute(
                    queries.IN_FLIGHT_SQLITE, {"destination_id": dest.pk, "now": adapt(now)}
                )
                in_flight = cursor.fetchone()[0]
                free = (
                    (1 if in_flight == 0 else 0) if allow.probe else dest.max_in_flight - in_flight
                )
                slots[dest.pk] = max(0, free)
                allowed = max(0, min(allow.allowed, free))
                if allowed:
                    state = _state_row(plan, now)
                    cursor.execute(
                        queries.LEASE_SQLITE.format(
                            eligible=queries.ELIGIBLE_IDS.format(
                                destination="%(destination_id)s", limit="%(allowed)s"
                            )
                        ),
                        {
                            "destination_id": dest.pk,
                            "allowed": allowed,
                            "lease_until": state["lease_until"],
                            "max_attempts": dest.max_attempts,
                            "now": adapt(now),
                            "unrecorded": UNRECORDED,
                        },
                    )
                    names = [column[0] for column in cursor.description]
                    taken = sorted(
                        (dict(zip(names, values, strict=True)) for values in cursor.fetchall()),
                        key=lambda m: m["id"],
                    )
                    claimed[dest.pk] = taken
            sending = sum(m["status"] == MessageStatus.SENDING for m in taken)
            if plan.after.counted or taken:
                state = _state_row(plan, now)
                state["tokens"] = allow.tokens - sending
                cursor.execute(queries.DESTINATION_WRITE_SQLITE, state)
                tokens[dest.pk] = state["tokens"]
    return _Written(claimed, frozenset(recorded), slots, tokens, {p.dest.pk: "" for p in plans})


def lease_margin() -> timedelta:
    """How long a lease outlives its request's deadline: as long as the request's record
    may take to commit, so that no other relay claims a message whose answer is on its
    way to the table. From the claim's ``now`` to the record's commit, three statements
    may each wait their bounds (LOCK_TIMEOUT_MS + STATEMENT_TIMEOUT_MS): the claim's own
    (the requests start after it commits), one the relay is in when the answer comes,
    and the answer's record; then RECORD_SLACK. With the default bounds (2 s and 5 s),
    24 s. A record later than that has failed at its bounds and the message goes again,
    under its key; a relay stopped longer (SIGSTOP) finds its record fenced off by the
    claim that took over."""
    settings = app_settings()
    bound_ms = settings.lock_timeout_ms + settings.statement_timeout_ms
    if not settings.lock_timeout_ms or not settings.statement_timeout_ms:
        return LEASE_MARGIN
    return timedelta(milliseconds=3 * bound_ms) + RECORD_SLACK


# --- what the round did --------------------------------------------------------------


def _outcome(plan: _Plan, written: _Written, now: datetime) -> Outcome:
    dest, allow = plan.dest, plan.allow
    rows = written.claimed.get(dest.pk, [])
    claimed = [_claimed(m, now) for m in rows if m["status"] != MessageStatus.FAILED]
    spent = [_claimed(m, now) for m in rows if m["status"] == MessageStatus.FAILED]
    tokens_left = written.tokens.get(dest.pk, allow.tokens)
    wait = None
    slots = written.slots.get(dest.pk)  # None: not counted (its bucket allowed nothing)
    taken = min(allow.allowed, slots) if slots is not None else allow.allowed
    bucket_short = allow.allowed < plan.work.claim and len(rows) >= allow.allowed
    if allow.open and bucket_short and (slots is None or slots > len(claimed)):
        # the bucket stopped the claim (not the slots, nor a lack of eligible messages)
        wait = token_wait(dest, tokens_left, plan.work.claim)
    # it took all its limits allowed: more may be eligible once answers free its slots
    more = bool(rows) and len(rows) >= taken and wait is None
    recorded = written.recorded & {sent.message.id for sent in plan.work.answers}
    paused = plan.after.paused_until
    return Outcome(
        dest.pk,
        destination=dest,
        claimed=claimed,
        spent=spent,
        recorded=frozenset(recorded),
        open=allow.open,
        paused_until=paused if paused is not None and paused > now else None,
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
