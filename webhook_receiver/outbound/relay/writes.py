"""A round's write: what the round decided, written, and the claims made, in one statement
on PostgreSQL (``queries.ROUND``, each destination's row held first, and guarded by its
version when the round decided from a row it kept) and in a statement a part on SQLite,
in the round's IMMEDIATE transaction (the record first: a claim then sees what it
recorded). The leases it gives, and what a claim whose unrecorded attempt spent the
budget leaves as the message's last error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from ...conf import app_settings
from ...core.encryption import SecretsUnreadable
from .. import queries
from ..models import MessageStatus, WebhookDestination
from .limits import After, Allowance
from .messages import Sent, Work
from .policy import Decision

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


@dataclass
class Plan:
    dest: WebhookDestination
    # the row's version the plan was decided from (None: read under lock in this round)
    version: str | None
    work: Work
    verdicts: list[Decision]
    after: After
    allow: Allowance
    unreadable: SecretsUnreadable | None


@dataclass(frozen=True)
class Written:
    claimed: dict[int, list[dict[str, Any]]]
    recorded: frozenset[int]
    # per destination: the requests it may still start (its free slots), and the bucket
    # as written (only where the row was written)
    slots: dict[int, int]
    tokens: dict[int, float]
    # the destinations the statement held, and each row's version after it
    versions: dict[int, str]


def write(plans: list[Plan], now: datetime, *, guarded: bool) -> Written:
    """The plans written and their claims made; ``guarded``: each only if its row is
    still the version it was decided from (``versions`` names those it was). A plan
    with nothing to write nor claim costs no statement, unless it is guarded: then the
    statement tells whether its row changed (an operator's recovery that ended a pause
    the kept row still has)."""
    if not guarded and not any(plan.work.answers or plan.allow.allowed for plan in plans):
        # nothing to record, nothing its limits allow now (paused, out of tokens)
        versions = {plan.dest.pk: getattr(plan.dest, "row_version", "") for plan in plans}
        return Written({}, frozenset(), {}, {}, versions)
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


def _state_row(plan: Plan, now: datetime) -> dict[str, Any]:
    """One destination's decisions as the statement takes them (``queries.STATE_TYPES``)."""
    adapt = connection.ops.adapt_datetimefield_value
    dest, after, allow = plan.dest, plan.after, plan.allow
    return {
        "id": dest.pk,
        "version": plan.version,
        "counted": after.counted,
        "allowed": allow.allowed,
        "in_flight_limit": allow.in_flight_limit,
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


def _write_postgresql(plans: list[Plan], now: datetime, *, guarded: bool) -> Written:
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
    return Written(
        claimed,
        frozenset(recorded),
        {key: value for key, value in json.loads(slots_json or "[]")},
        {key: value for key, value in json.loads(tokens_json or "[]")},
        versions,
    )


def _write_sqlite(plans: list[Plan], now: datetime) -> Written:
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
                free = allow.in_flight_limit - in_flight
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
    return Written(claimed, frozenset(recorded), slots, tokens, {p.dest.pk: "" for p in plans})


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
