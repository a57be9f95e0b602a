"""The outbox's SQL: every statement that admission and the relay write out, each with its
purpose.

Why written out: a relay round is two statements on PostgreSQL, whatever the number of
destinations in it (the rows locked and read; the answers recorded and the next
messages claimed), each read here whole, and the ORM cannot say ``INSERT … ON CONFLICT
DO NOTHING RETURNING`` (how admission learns whether it created the message) nor
data-modifying CTEs (the round's write). What the limits decide (the breaker, the
bucket, retirement) is decided in Python (breaker.py, relay/limits.py) and only written
here; the statements count the requests in flight, under the row's lock.
Statuses come from ``MessageStatus``; datetimes go through ``connection.ops`` (SQLite
keeps them as text). RETURNING and ``UPDATE … FROM`` need SQLite 3.35 or newer (system
check webhook_receiver.E007). Table names are the models' ``db_table``.
"""

from __future__ import annotations

from .models import MessageStatus

PENDING = MessageStatus.PENDING.value
SENDING = MessageStatus.SENDING.value
DELIVERED = MessageStatus.DELIVERED.value
FAILED = MessageStatus.FAILED.value

# --- admission ---------------------------------------------------------------------------

# One message per (destination, key), forever: a conflict creates nothing (and leaves the
# first message's metadata as it is: the metadata is not part of the identity). On
# PostgreSQL a message created also notifies the relays (relay/wakeups.py), which hear it
# when, and only if, the transaction commits (PostgreSQL sends one notification per
# destination and transaction); not while its breaker has paused the destination: the
# poll after the pause finds it (the pause is read here, in the insert's own statement,
# rather than a read of the row for every admission; it only wakes a relay, whose round
# decides the breaker: breaker.py). A message the destination's filter leaves out is
# written discarded (by "filter", with the reason) and wakes no relay.
_INSERT_MESSAGE = """
    INSERT INTO webhook_receiver_outboxmessage
        (destination_id, key, event_type, payload, metadata, ordering_key, status, attempts,
         failures, next_attempt_at, origin_source, origin_event_key, traceparent, created_at,
         last_error, discarded_by, discard_reason, discarded_at)
    VALUES
        (%(destination_id)s, %(key)s, %(event_type)s, %(payload)s, %(metadata)s,
         %(ordering_key)s, %(status)s, 0, 0, %(next_attempt_at)s, %(origin_source)s,
         %(origin_event_key)s, %(traceparent)s, %(created_at)s, '', %(discarded_by)s,
         %(discard_reason)s, %(discarded_at)s)
    ON CONFLICT (destination_id, key) DO NOTHING
    RETURNING id{notify}
"""
INSERT_MESSAGE = {
    "postgresql": _INSERT_MESSAGE.format(
        notify=""", (
        SELECT pg_notify('webhook_receiver_outbox', d.id::text)
        FROM webhook_receiver_webhookdestination d
        WHERE d.id = %(destination_id)s AND %(status)s = 'pending'
          AND (d.paused_until IS NULL OR d.paused_until <= %(created_at)s)
    ) AS notified"""
    ),
    "sqlite": _INSERT_MESSAGE.format(notify=""),
}

# The insert's own lock bound, sent with it (bounds.execute_bounded): the transaction's
# bound is kept aside (evaluated in WHERE, before the new one is set) and put back after,
# so that the rest of the caller's transaction keeps its own (ADMISSION_LOCK_TIMEOUT_MS).
SHORTEN_LOCK_BOUND = """
    SELECT set_config('lock_timeout', %(admission_lock_timeout)s, true)
    WHERE set_config('webhook_receiver.lock_timeout', current_setting('lock_timeout'), true)
          IS NOT NULL
"""
RESTORE_LOCK_BOUND = """
    SELECT set_config('lock_timeout', current_setting('webhook_receiver.lock_timeout'), true)
"""

# --- the relay's round ------------------------------------------------------------------
#
# A round records the answers that came and claims for any number of destinations:
# DESTINATIONS_LOCKED reads their rows under lock, relay/limits.py decides, and ROUND
# writes and claims (SQLite: its parts, a statement each).

# The rows of the round's destinations, locked in id order (two rounds never wait for
# each other in a circle); a row another relay's round holds is skipped, left to it.
DESTINATIONS_LOCKED = """
    SELECT d.*, d.xmin::text AS row_version FROM webhook_receiver_webhookdestination d
    WHERE d.id = ANY(%(ids)s)
    ORDER BY d.id
    FOR UPDATE SKIP LOCKED
"""
# SQLite: the rows ({ids}: a placeholder each); the round's IMMEDIATE transaction holds
# every writer off.
DESTINATIONS_SQLITE = """
    SELECT d.* FROM webhook_receiver_webhookdestination d WHERE d.id IN ({ids}) ORDER BY d.id
"""

# A round's answers, one row each (``answer``): the verdict on its message, the attempt
# that fences it, and the attempt's row. On PostgreSQL they come as one JSON array of
# objects (one text parameter, however many answers, costs the driver less than an
# array per column); SQLite takes them as VALUES (ANSWERS_SQLITE).
ANSWER_TYPES = {
    "destination_id": "bigint",
    "message_id": "bigint",
    "attempt": "integer",
    "status": "text",
    "failures": "integer",
    "next_attempt_at": "timestamptz",
    "delivered_at": "timestamptz",
    "status_code": "integer",
    "last_error": "text",
    "started_at": "timestamptz",
    "duration_ms": "integer",
    "error": "text",
    "excerpt": "text",
    "attempt_next_at": "timestamptz",
}
ANSWER_COLUMNS = tuple(ANSWER_TYPES)
_ANSWER = ", ".join(ANSWER_COLUMNS)

# What the round decided for each destination (relay/limits.py), one row each: the
# version of the row it decided from (NULL: read under lock in this transaction), whether
# its answers counted, how many messages its claim may take before the requests in flight
# are counted (``allowed``), how many may be in flight at once (``in_flight_limit``: the
# breaker's, breaker.py), the lease its claim gives, and the row's state to write back
# (the bucket before the claim spends from it).
STATE_TYPES = {
    "id": "bigint",
    "version": "text",
    "counted": "boolean",
    "allowed": "integer",
    "in_flight_limit": "integer",
    "max_attempts": "integer",
    "lease_until": "timestamptz",
    "tokens": "float8",
    "tokens_at": "timestamptz",
    "consecutive_failures": "integer",
    "paused_until": "timestamptz",
    "last_success_at": "timestamptz",
    "last_failure_at": "timestamptz",
    "failing_since": "timestamptz",
    "failing_warned_at": "timestamptz",
    "enabled": "boolean",
    "disabled_reason": "text",
    "disabled_at": "timestamptz",
}
# the row's columns a round writes back as decided
STATE_WRITTEN = (
    "consecutive_failures",
    "paused_until",
    "last_success_at",
    "last_failure_at",
    "failing_since",
    "failing_warned_at",
    "enabled",
    "disabled_reason",
    "disabled_at",
)


def _recordset(parameter: str, types: dict[str, str]) -> str:
    columns = ", ".join(f"{name} {kind}" for name, kind in types.items())
    return f"SELECT * FROM jsonb_to_recordset(%({parameter})s::jsonb) AS r ({columns})"


# SQLite: the answers as a CTE of VALUES ({rows}: one parenthesised row each) before
# RECORD_MESSAGES_SQLITE and RECORD_ATTEMPTS.
ANSWERS_SQLITE = f"WITH answer ({_ANSWER}) AS (VALUES {{rows}})"

# Each answer's verdict, only on messages this claim still holds (sending, at this
# attempt): a relay whose lease ran out (frozen, or held by a slow answer) must not
# undo the claim that took over. The ones it changed come back, with their new status
# (SQLite's RETURNING names the table's columns unqualified, and its ids alone are read).
# The status is tested as an expression (IS TRUE) that no index answers, so that the
# plan starts from the answers' ids, by the primary key: on the statistics of a quiet
# outbox (analysed with nothing in flight) PostgreSQL takes 'sending' to match almost no
# row, and read the messages in flight through an index on the status, all of them for
# each answer (730 ms of a round of 784 answers, against 14 ms by the key).
_RECORD_MESSAGES = f"""
    UPDATE webhook_receiver_outboxmessage AS m
    SET status = a.status, failures = a.failures, next_attempt_at = a.next_attempt_at,
        lease_until = NULL, delivered_at = a.delivered_at, last_status_code = a.status_code,
        last_error = a.last_error
    FROM answer a
    WHERE m.id = a.message_id AND (m.status = '{SENDING}') IS TRUE AND m.attempts = a.attempt
    RETURNING {{returning}}
"""
RECORD_MESSAGES = _RECORD_MESSAGES.format(returning="m.id, m.status")
RECORD_MESSAGES_SQLITE = _RECORD_MESSAGES.format(returning="id")

# One attempt row per answer, recorded or not (an answer that came after its lease ran
# out was still an attempt).
RECORD_ATTEMPTS = """
    INSERT INTO webhook_receiver_deliveryattempt (message_id, number, started_at,
        duration_ms, status_code, error, response_excerpt, next_attempt_at)
    SELECT message_id, attempt, started_at, duration_ms, status_code, error, excerpt,
        attempt_next_at
    FROM answer
"""

# Eligible messages of one destination ({destination}), oldest first, at most {limit}:
# pending and due, or claimed by a relay whose lease has run out (the partial index
# webhook_outbox_open holds just the open ones, so delivered history costs nothing). A
# message waits while an older one with its ordering key is still open (pending,
# sending, or failed until an operator acts). The statement that records a round and
# claims sees the round's messages as they were before it: one of them is not claimed
# again in it (``answer``), and one it delivers no longer holds its key (``recorded``).
ELIGIBLE_IDS = f"""
    SELECT m.id FROM webhook_receiver_outboxmessage m
    WHERE m.destination_id = {{destination}}
      AND m.status IN ('{PENDING}', '{SENDING}')
      AND ((m.status = '{PENDING}' AND m.next_attempt_at <= %(now)s)
           OR (m.status = '{SENDING}' AND m.lease_until <= %(now)s))
      AND m.id NOT IN (SELECT message_id FROM answer)
      AND (m.ordering_key = '' OR NOT EXISTS (
            SELECT 1 FROM webhook_receiver_outboxmessage o
            WHERE o.destination_id = m.destination_id AND o.ordering_key = m.ordering_key
              AND o.id < m.id AND o.status IN ('{PENDING}', '{SENDING}', '{FAILED}')
              AND o.id NOT IN (SELECT id FROM recorded WHERE status = '{DELIVERED}')))
    ORDER BY m.id
    LIMIT {{limit}}
"""
# PostgreSQL: rows another relay is claiming are skipped, not waited for (SQLite: none
# other is)
ROW_LOCK = {"postgresql": " FOR UPDATE OF m SKIP LOCKED", "sqlite": ""}

# The lease: the eligible rows (selected once: ``claimable``) take a lease and count an
# attempt, and come back to be sent. One still sending had a lease that ran out: its
# attempt was never recorded (its relay stopped, or the database refused the round), and
# it spends the retry budget as a failure does. When that spends the last of it, the
# message is failed here instead of sent again (SPENT; every SET sees the row as it was).
_SPENT = f"(u.status = '{SENDING}' AND u.failures + 1 >= a.max_attempts)"
_LEASE = f"""
    UPDATE webhook_receiver_outboxmessage AS u
    SET status = CASE WHEN {_SPENT} THEN '{FAILED}' ELSE '{SENDING}' END,
        lease_until = CASE WHEN {_SPENT} THEN NULL ELSE a.lease_until END,
        attempts = u.attempts + CASE WHEN {_SPENT} THEN 0 ELSE 1 END,
        next_attempt_at = CASE WHEN {_SPENT} THEN %(now)s ELSE u.next_attempt_at END,
        last_error = CASE WHEN {_SPENT} THEN %(unrecorded)s ELSE u.last_error END,
        failures = u.failures + CASE WHEN u.status = '{SENDING}' THEN 1 ELSE 0 END
    FROM allowance a
    WHERE u.id IN (SELECT id FROM claimable) AND a.id = u.destination_id
    RETURNING {{returning}}
"""
_LEASED = (
    "id", "destination_id", "key", "event_type", "payload", "attempts", "failures",
    "created_at", "status", "traceparent",
)  # fmt: skip
# (SQLite's RETURNING names the table's columns unqualified; PostgreSQL's must qualify
# them, the allowance having an id of its own)
LEASE = _LEASE.format(returning=", ".join(f"u.{column}" for column in _LEASED))
LEASE_RETURNING_UNQUALIFIED = _LEASE.format(returning=", ".join(_LEASED))

# The requests in flight of a destination, on every relay: its unexpired leases.
_IN_FLIGHT = f"""
    SELECT count(*) AS in_flight FROM webhook_receiver_outboxmessage m
    WHERE m.destination_id = {{destination}} AND m.status = '{SENDING}'
      AND m.lease_until > %(now)s {{beside}}
"""

# PostgreSQL: the round's write, one statement, all or nothing. Each destination's row is
# locked first (``locked``), if it is still the version the round decided from (a row
# read under lock earlier in the transaction has none to compare, and is held already);
# one another relay holds, or whose version changed since, is left out of the whole
# statement, and the round reads it again under lock (round.py). For the rest: the
# answers recorded (``recorded``, ``attempt``); the requests in flight counted (the
# statement's snapshot sees every claim that committed before the row was locked: a
# claim that committed after the snapshot wrote the row, so its version changed, and the
# row is left out), less the ones this statement records; each destination's claim, no
# more than its free slots (``allowance``: the in-flight limit Python decided, one probe
# while half-open, less the requests counted here, under the row's lock, where Python
# cannot see them); the leases; each row written once (the decided state, and the
# bucket less the messages claimed to be sent), and only where its answers counted or
# it claimed. It
# returns the claimed messages as JSON, oldest first, the messages it recorded, each
# locked destination's version after the statement, its free slots and the bucket it
# wrote. {eligible}: ELIGIBLE_IDS for ``a.id``, at most ``a.allowed``, with its ROW_LOCK
# (round_statement()).
ROUND = f"""
    WITH state AS ({_recordset("states", STATE_TYPES)}),
    locked AS MATERIALIZED (
        SELECT d.id, d.xmin::text AS version FROM webhook_receiver_webhookdestination d
        JOIN state s ON s.id = d.id
        WHERE s.version IS NULL OR d.xmin::text = s.version
        ORDER BY d.id
        FOR UPDATE OF d SKIP LOCKED
    ),
    answer AS (
        SELECT r.* FROM ({_recordset("answers", ANSWER_TYPES)}) r
        WHERE r.destination_id IN (SELECT id FROM locked)
    ),
    recorded AS ({RECORD_MESSAGES}),
    attempt AS ({RECORD_ATTEMPTS}),
    allowance AS MATERIALIZED (
        SELECT s.id, s.max_attempts, s.lease_until, f.slots,
            LEAST(s.allowed, f.slots) AS allowed
        FROM state s JOIN locked l ON l.id = s.id CROSS JOIN LATERAL (
            SELECT GREATEST(0, s.in_flight_limit - i.in_flight) AS slots
            FROM ({
    _IN_FLIGHT.format(destination="s.id", beside="AND m.id NOT IN (SELECT id FROM recorded)")
}) i
        ) f
        WHERE s.allowed > 0
    ),
    claimable AS MATERIALIZED (
        SELECT e.id FROM allowance a CROSS JOIN LATERAL ({{eligible}}) e
    ),
    claimed AS ({LEASE}),
    written AS (
        UPDATE webhook_receiver_webhookdestination AS d
        SET tokens = CASE WHEN s.allowed > 0 THEN s.tokens - (
                SELECT count(*) FROM claimed c
                WHERE c.destination_id = d.id AND c.status = '{SENDING}'
            ) ELSE d.tokens END,
            tokens_at = CASE WHEN s.allowed > 0 THEN s.tokens_at ELSE d.tokens_at END,
            {", ".join(f"{column} = s.{column}" for column in STATE_WRITTEN)}
        FROM state s
        WHERE d.id = s.id AND d.id IN (SELECT id FROM locked)
          AND (s.counted OR EXISTS (SELECT 1 FROM claimed c WHERE c.destination_id = d.id))
        RETURNING d.id, d.tokens, d.xmin::text AS version
    )
    SELECT (SELECT json_agg(c ORDER BY c.id) FROM claimed c)::text AS claimed,
        ARRAY(SELECT id FROM recorded) AS recorded,
        (SELECT json_agg(json_build_array(l.id, COALESCE(w.version, l.version)))
            FROM locked l LEFT JOIN written w ON w.id = l.id)::text AS locked,
        (SELECT json_agg(json_build_array(a.id, a.slots)) FROM allowance a)::text AS slots,
        (SELECT json_agg(json_build_array(w.id, w.tokens)) FROM written w)::text AS tokens
"""


def round_statement() -> str:
    """ROUND with its eligibility (read here at each call, so that a test may change it)."""
    eligible = ELIGIBLE_IDS.format(destination="a.id", limit="a.allowed")
    return ROUND.format(eligible=eligible + ROW_LOCK["postgresql"])


# SQLite: a destination's requests in flight (its round's answers recorded already)
IN_FLIGHT_SQLITE = _IN_FLIGHT.format(destination="%(destination_id)s", beside="")

# SQLite: the lease of as many eligible messages as the limits allow ({eligible}:
# ELIGIBLE_IDS for this destination), the round's answers recorded already
LEASE_SQLITE = f"""
    WITH allowance AS (
        SELECT %(destination_id)s AS id, %(lease_until)s AS lease_until,
            %(max_attempts)s AS max_attempts
    ),
    answer (message_id) AS (SELECT NULL WHERE 0),
    recorded (id, status) AS (SELECT NULL, NULL WHERE 0),
    claimable AS MATERIALIZED ({{eligible}})
    {LEASE_RETURNING_UNQUALIFIED}
"""

# SQLite: a destination's row as the round decided it, the bucket less what it claimed
DESTINATION_WRITE_SQLITE = f"""
    UPDATE webhook_receiver_webhookdestination
    SET tokens = %(tokens)s, tokens_at = %(tokens_at)s,
        {", ".join(f"{column} = %({column})s" for column in STATE_WRITTEN)}
    WHERE id = %(id)s
"""

# A round that could not be recorded, for the overview and webhook_status (in a
# transaction of its own, after the round's rolled back).
RECORD_FAILED = """
    UPDATE webhook_receiver_webhookdestination SET record_error = %s, record_failed_at = %s
    WHERE id = %s
"""
