"""The outbox's SQL: every statement that admission and the relay write out, each with its
purpose.

Why written out: a relay round is two statements on PostgreSQL, a claim and a record,
each read here whole, and the ORM cannot say ``INSERT … ON CONFLICT DO NOTHING
RETURNING`` (how admission learns whether it created the message) nor data-modifying
CTEs (the claim and the record). Statuses come from ``MessageStatus``; datetimes go
through ``connection.ops`` (SQLite keeps them as text). RETURNING and ``UPDATE … FROM``
need SQLite 3.35 or newer (system check webhook_receiver.E007). Table names are the
models' ``db_table``.
"""

from __future__ import annotations

from .models import MessageStatus

PENDING = MessageStatus.PENDING.value
SENDING = MessageStatus.SENDING.value
DELIVERED = MessageStatus.DELIVERED.value
FAILED = MessageStatus.FAILED.value

# --- admission ---------------------------------------------------------------------------

# One message per (destination, key), forever: a conflict creates nothing (and leaves the
# first message's metadata as it is: the metadata is not part of the identity). It says
# whether its breaker has paused the destination: then no run is triggered (it could
# claim nothing), and the first sweep after the pause queues one.
INSERT_MESSAGE = """
    INSERT INTO webhook_receiver_outboxmessage
        (destination_id, key, event_type, payload, metadata, ordering_key, status, attempts,
         failures, next_attempt_at, origin_source, origin_event_key, traceparent, created_at,
         last_error, discarded_by, discard_reason)
    VALUES
        (%(destination_id)s, %(key)s, %(event_type)s, %(payload)s, %(metadata)s,
         %(ordering_key)s, %(status)s, 0, 0, %(next_attempt_at)s, %(origin_source)s,
         %(origin_event_key)s, %(traceparent)s, %(created_at)s, '', '', '')
    ON CONFLICT (destination_id, key) DO NOTHING
    RETURNING id, (
        SELECT d.paused_until IS NOT NULL AND d.paused_until > %(created_at)s
        FROM webhook_receiver_webhookdestination d WHERE d.id = %(destination_id)s
    ) AS paused
"""

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

# --- the relay's record ----------------------------------------------------------------
#
# A round's answers, one row each (``answer``): the verdict on its message, the attempt
# that fences it, and the attempt's row. On PostgreSQL they come as one JSON array of
# objects (ANSWERS_POSTGRESQL reads it: one text parameter, however many answers, costs
# the driver less than an array per column); SQLite takes them as VALUES (ANSWERS_SQLITE).
ANSWER_TYPES = {
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

ANSWERS_POSTGRESQL = f"""
    answer AS (
        SELECT * FROM jsonb_to_recordset(%(answers)s::jsonb)
            AS a ({", ".join(f"{name} {kind}" for name, kind in ANSWER_TYPES.items())})
    )
"""

# SQLite: the answers as a CTE of VALUES ({rows}: one parenthesised row each) before
# RECORD_MESSAGES and RECORD_ATTEMPTS.
ANSWERS_SQLITE = f"WITH answer ({_ANSWER}) AS (VALUES {{rows}})"

# Each answer's verdict, only on messages this claim still holds (sending, at this
# attempt): a worker whose lease ran out (frozen, or held by a slow answer) must not
# undo the claim that took over. The ones it changed come back, with their new status
# (SQLite's RETURNING names the table's columns unqualified, and its ids alone are read).
_RECORD_MESSAGES = f"""
    UPDATE webhook_receiver_outboxmessage AS m
    SET status = a.status, failures = a.failures, next_attempt_at = a.next_attempt_at,
        lease_until = NULL, delivered_at = a.delivered_at, last_status_code = a.status_code,
        last_error = a.last_error
    FROM answer a
    WHERE m.id = a.message_id AND m.status = '{SENDING}' AND m.attempts = a.attempt
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


# Retirement (retirement.py), counted with the breaker on the row as it was before the
# round (``{d}``: its columns' prefix): an enabled destination that answered 410 Gone, or
# whose answers failed, with no success, since before %(disable_before)s (NULL: never),
# is disabled, and this is the reason; its messages stay pending, held. A round of
# failures with none since before %(warn_before)s warns once (the failing span's notice).
def _retired(d: str) -> str:
    return f"""CASE WHEN NOT {d}enabled THEN NULL
            WHEN %(round_gone)s > 0 THEN %(gone_reason)s
            WHEN %(round_successes)s = 0 AND %(round_failures)s > 0
                AND {d}failing_since <= %(disable_before)s THEN %(failing_reason)s END"""


def _failing_since(d: str) -> str:
    """The failing span's start after the round: a success ends it; the first failure
    after one starts it."""
    return f"""CASE WHEN %(round_successes)s > 0 THEN NULL
            WHEN %(round_failures)s > 0 THEN COALESCE({d}failing_since, %(now)s)
            ELSE {d}failing_since END"""


def _warned(d: str) -> str:
    return f"""%(round_successes)s = 0 AND %(round_failures)s > 0
            AND {d}failing_warned_at IS NULL AND {d}failing_since <= %(warn_before)s"""


def _failing_warned_at(d: str) -> str:
    """When the failing span was warned of: now, once it has lasted past the warning
    (once); a success forgets it."""
    return f"""CASE WHEN %(round_successes)s > 0 THEN NULL
            WHEN {_warned(d)} THEN %(now)s ELSE {d}failing_warned_at END"""


# The breaker (breaker.BreakerCount) after a round's answers, from the destination's
# row as CLAIM read it under its lock: a success closes it; failures add to the consecutive
# ones, and pause the destination once they reach the threshold. A round with no
# answer leaves it as it is (``counted`` false).
_BREAKER_AFTER = f"""
    SELECT d.id,
        %(round_successes)s + %(round_failures)s + %(round_gone)s > 0 AS counted,
        CASE WHEN %(round_successes)s > 0 THEN 0
            ELSE d.consecutive_failures + %(round_failures)s END AS consecutive_failures,
        CASE WHEN %(round_successes)s + %(round_failures)s = 0 THEN d.paused_until
            WHEN %(round_successes)s = 0
                AND d.consecutive_failures + %(round_failures)s >= %(threshold)s
            THEN %(paused_until)s::timestamptz END AS paused_until,
        CASE WHEN %(round_successes)s > 0 THEN %(now)s::timestamptz
            ELSE d.last_success_at END AS last_success_at,
        CASE WHEN %(round_successes)s = 0 AND %(round_failures)s > 0 THEN %(now)s::timestamptz
            ELSE d.last_failure_at END AS last_failure_at,
        {_failing_since("d.")} AS failing_since,
        {_failing_warned_at("d.")} AS failing_warned_at,
        {_retired("d.")} AS retired,
        COALESCE({_warned("d.")}, false) AS warned
    FROM destination d
"""

# SQLite, and RECORD: the breaker (breaker.BreakerCount) counted on the row, in the
# UPDATE itself, under its lock, so that two workers' rounds both count: as
# _BREAKER_AFTER computes it. It returns the count (no row: a round with no answer),
# and the reason it retired the destination (NULL: it did not) and whether it warned
# (both read from the row as written: the moment they were set is this round's).
BREAKER_COUNT = f"""
    UPDATE webhook_receiver_webhookdestination
    SET enabled = CASE WHEN ({_retired("")}) IS NULL THEN enabled ELSE false END,
        disabled_reason = COALESCE({_retired("")}, disabled_reason),
        disabled_at = CASE WHEN ({_retired("")}) IS NULL THEN disabled_at ELSE %(now)s END,
        failing_since = {_failing_since("")},
        failing_warned_at = {_failing_warned_at("")},
        consecutive_failures = CASE WHEN %(round_successes)s > 0 THEN 0
            ELSE consecutive_failures + %(round_failures)s END,
        paused_until = CASE WHEN %(round_successes)s + %(round_failures)s = 0 THEN paused_until
            WHEN %(round_successes)s = 0
                AND consecutive_failures + %(round_failures)s >= %(threshold)s
            THEN %(paused_until)s END,
        last_success_at = CASE WHEN %(round_successes)s > 0 THEN %(now)s ELSE last_success_at END,
        last_failure_at = CASE WHEN %(round_successes)s = 0 AND %(round_failures)s > 0
            THEN %(now)s ELSE last_failure_at END
    WHERE id = %(destination_id)s
        AND %(round_successes)s + %(round_failures)s + %(round_gone)s > 0
    RETURNING consecutive_failures,
        CASE WHEN NOT enabled AND disabled_at = %(now)s THEN disabled_reason END AS retired,
        enabled AND failing_warned_at = %(now)s AS warned
"""

# PostgreSQL: a round's record alone (the last of a run, or one answer at a time after a
# round that could not be recorded whole), in one statement, all or nothing. It returns
# the messages it recorded, the breaker's count (NULL: not counted) and retirement's.
RECORD = f"""
    WITH {ANSWERS_POSTGRESQL},
    recorded AS ({RECORD_MESSAGES}),
    attempt AS ({RECORD_ATTEMPTS}),
    breaker AS ({BREAKER_COUNT})
    SELECT ARRAY(SELECT id FROM recorded) AS recorded,
        (SELECT consecutive_failures FROM breaker) AS consecutive_failures,
        (SELECT retired FROM breaker) AS retired,
        COALESCE((SELECT warned FROM breaker), false) AS warned
"""

# --- the relay's claim ---------------------------------------------------------------------
#
# PostgreSQL records a round and claims the next in one statement (CLAIM); a run's first
# claim is the same statement with no answer. SQLite has no data-modifying CTE: it
# records (its three parts above), reads the destination (DESTINATION_WITH_IN_FLIGHT),
# computes its limits in Python (claim.py mirrors the allowance below) and writes the
# lease (LEASE_ALLOWED) and the bucket (TOKENS_SPENT) in statements of their own, in one
# IMMEDIATE transaction, which serialises writers as the row's lock does on PostgreSQL.
# Both share the eligibility and the lease, which read what the limits allow from a CTE
# named ``allowance``.

# Eligible messages of one destination, oldest first: pending and due, or claimed by a
# worker whose lease has run out (the partial index webhook_outbox_open holds just the
# open ones, so delivered history costs nothing). A message waits while an older one
# with its ordering key is still open (pending, sending, or failed until an operator
# acts). As many as the destination's limits allow (``allowance``), and none when it
# has no row (a destination another worker holds). The statement that records a round
# and claims the next sees the round's messages as they were before it: one of them is
# not claimed again in it (``answer``), and one it delivers no longer holds its key
# (``recorded``); a claim alone has neither.
ELIGIBLE_IDS = f"""
    SELECT m.id FROM webhook_receiver_outboxmessage m
    WHERE m.destination_id = %(destination_id)s
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
    LIMIT COALESCE((SELECT allowed FROM allowance), 0)
"""

# PostgreSQL: rows another worker is claiming are skipped, not waited for (SQLite: the
# plain one)
ELIGIBLE = {"postgresql": ELIGIBLE_IDS + " FOR UPDATE OF m SKIP LOCKED"}

# The lease: the eligible rows (selected once: MATERIALIZED, as ``claimable``) take a
# lease and count an attempt, and come back to be sent. One still sending had a lease
# that ran out: its attempt was never recorded (its worker stopped, or the database
# refused the round), and it spends the retry budget as a failure does. When that spends
# the last of it, the message is failed here instead of sent again (SPENT; every SET
# sees the row as it was).
_SPENT = f"(status = '{SENDING}' AND failures + 1 >= (SELECT max_attempts FROM allowance))"
LEASE = f"""
    UPDATE webhook_receiver_outboxmessage
    SET status = CASE WHEN {_SPENT} THEN '{FAILED}' ELSE '{SENDING}' END,
        lease_until = CASE WHEN {_SPENT} THEN NULL ELSE (SELECT lease_until FROM allowance) END,
        attempts = attempts + CASE WHEN {_SPENT} THEN 0 ELSE 1 END,
        next_attempt_at = CASE WHEN {_SPENT} THEN %(now)s ELSE next_attempt_at END,
        last_error = CASE WHEN {_SPENT} THEN %(unrecorded)s ELSE last_error END,
        failures = failures + CASE WHEN status = '{SENDING}' THEN 1 ELSE 0 END
    WHERE id IN (SELECT id FROM claimable)
    RETURNING id, key, event_type, payload, attempts, failures, created_at, status,
        traceparent
"""

# The token bucket at %(now)s (PostgreSQL; claim._refilled on SQLite, to the same float
# operations in the same order): refilled at rate_count per rate_seconds since it was
# last written, holding at most ``burst`` (at least one) tokens. A new bucket is full.
REFILLED = """
    CASE WHEN d.tokens_at IS NULL THEN GREATEST(1, d.burst)::float8
    ELSE LEAST(
        GREATEST(1, d.burst)::float8,
        d.tokens + GREATEST(0, EXTRACT(EPOCH FROM %(now)s::timestamptz - d.tokens_at)::float8)
            * d.rate_count / d.rate_seconds)
    END
"""


def _claim(lock: str) -> str:
    return f"""
    WITH {ANSWERS_POSTGRESQL},
    destination AS MATERIALIZED (
        SELECT d.*, d.xmin::text AS locked_version
        FROM webhook_receiver_webhookdestination d
        WHERE d.id = %(destination_id)s
        {lock}
    ),
    recorded AS ({RECORD_MESSAGES}),
    attempt AS ({RECORD_ATTEMPTS}),
    breaker AS MATERIALIZED ({_BREAKER_AFTER}),
    state AS MATERIALIZED (
        SELECT d.id, d.tokens_at, d.max_attempts,
            d.enabled AND b.retired IS NULL
                AND (b.paused_until IS NULL OR b.paused_until <= %(now)s::timestamptz) AS open,
            -- the row as this statement's snapshot has it: a claim that committed after
            -- the snapshot (while this one waited for the lock) holds leases that the
            -- count below cannot see, so this statement claims nothing (claim.py claims
            -- again, with a snapshot that sees them)
            d.locked_version = (
                SELECT s.xmin::text FROM webhook_receiver_webhookdestination s
                WHERE s.id = d.id
            ) AS current,
            -- free slots: requests in flight on every worker are its unexpired leases,
            -- less the ones this statement records; half-open (the failures at the
            -- threshold), one probe when none is in flight
            CASE WHEN b.consecutive_failures >= d.breaker_threshold
                THEN LEAST(d.max_in_flight - f.in_flight,
                           CASE WHEN f.in_flight = 0 THEN 1 ELSE 0 END)
                ELSE d.max_in_flight - f.in_flight
            END AS slots,
            {REFILLED} AS tokens,
            %(now)s::timestamptz + make_interval(secs => d.timeout_seconds)
                + %(lease_margin)s::interval AS lease_until
        FROM destination d JOIN breaker b ON b.id = d.id, LATERAL (
            SELECT count(*) AS in_flight FROM webhook_receiver_outboxmessage m
            WHERE m.destination_id = d.id AND m.status = '{SENDING}'
              AND m.lease_until > %(now)s::timestamptz
              AND m.id NOT IN (SELECT id FROM recorded)
        ) f
    ),
    -- whole tokens, forgiving the float's last bits: 1.9999999999999982 is two
    allowance AS MATERIALIZED (
        SELECT s.*, CASE WHEN s.open AND s.current THEN GREATEST(0, LEAST(
            %(limit)s::integer, s.slots, floor(s.tokens + %(token_epsilon)s::float8)::bigint
        )) ELSE 0 END AS allowed
        FROM state s
    ),
    claimable AS MATERIALIZED ({{eligible}}),
    claimed AS ({LEASE}),
    -- one write of the row: the breaker after the answers, and the bucket less the
    -- messages claimed to be sent, its time never moved back (`now` may predate the
    -- last writer's: read before the lock was waited for, or on a host whose clock is
    -- behind; a span refills once)
    written AS (
        UPDATE webhook_receiver_webhookdestination d
        SET tokens = CASE WHEN a.open AND a.current
                THEN a.tokens - (SELECT count(*) FROM claimed c WHERE c.status = '{SENDING}')
                ELSE d.tokens END,
            tokens_at = CASE WHEN a.open AND a.current
                THEN GREATEST(%(now)s::timestamptz, COALESCE(a.tokens_at, %(now)s::timestamptz))
                ELSE d.tokens_at END,
            consecutive_failures = b.consecutive_failures, paused_until = b.paused_until,
            last_success_at = b.last_success_at, last_failure_at = b.last_failure_at,
            failing_since = b.failing_since, failing_warned_at = b.failing_warned_at,
            enabled = d.enabled AND b.retired IS NULL,
            disabled_reason = COALESCE(b.retired, d.disabled_reason),
            disabled_at = CASE WHEN b.retired IS NULL THEN d.disabled_at
                ELSE %(now)s::timestamptz END
        FROM allowance a JOIN breaker b ON b.id = a.id
        WHERE d.id = a.id AND ((a.open AND a.current) OR b.counted)
        RETURNING d.tokens
    )
    SELECT d.*, a.open, a.current, a.slots,
        CASE WHEN a.open AND a.current THEN (SELECT tokens FROM written) END AS tokens_left,
        (SELECT json_agg(c ORDER BY c.id) FROM claimed c)::text AS claimed,
        ARRAY(SELECT id FROM recorded) AS recorded,
        CASE WHEN b.counted THEN b.consecutive_failures END AS counted_failures,
        b.retired, COALESCE(b.warned AND b.retired IS NULL, false) AS warned,
        EXISTS (
            SELECT 1 FROM webhook_receiver_webhookdestination s WHERE s.id = %(destination_id)s
        ) AS found
    FROM (VALUES (1)) AS one (n)
    LEFT JOIN destination d ON true
    LEFT JOIN allowance a ON true
    LEFT JOIN breaker b ON true
"""


# PostgreSQL: a round's record and the next round's claim in one statement (a run's
# first claim: no answer). The destination's row, locked (its token bucket, breaker and
# in-flight count live on it: one claimer at a time; SKIP LOCKED for a triggered run's
# first claim, which leaves a busy destination to the worker that holds it: a round
# with answers waits for the lock); the answers recorded and the breaker counted (as
# RECORD does); what the limits allow now, after the answers (enabled, not retired by
# them, and not paused;
# its free slots, the breaker's one probe when half-open; its whole tokens); the
# eligible messages leased; the row written back once. It returns the destination's row
# as it was locked (a run needs no other read of it), the claimed messages as JSON,
# oldest first, what RelayRound.wait is computed from, the messages it recorded and the
# breaker's count, and retirement's (a 410, a failing span past its bound: counted with
# the breaker, so that a round stays one statement). Keyed by skip_if_busy; {eligible}
# is ELIGIBLE["postgresql"].
CLAIM = {
    False: _claim("FOR UPDATE OF d"),
    True: _claim("FOR UPDATE OF d SKIP LOCKED"),
}

# SQLite: the destination's row, with its requests in flight on every worker: its
# unexpired leases.
DESTINATION_WITH_IN_FLIGHT = f"""
    SELECT d.*, (
        SELECT count(*) FROM webhook_receiver_outboxmessage m
        WHERE m.destination_id = d.id AND m.status = '{SENDING}' AND m.lease_until > %(now)s
    ) AS in_flight
    FROM webhook_receiver_webhookdestination d
    WHERE d.id = %(destination_id)s
"""

# SQLite: the lease of as many eligible messages as claim.py found the limits allow (its
# round recorded already: no answer here).
LEASE_ALLOWED = f"""
    WITH allowance AS (
        SELECT %(allowed)s AS allowed, %(lease_until)s AS lease_until,
            %(max_attempts)s AS max_attempts
    ),
    answer (message_id) AS (SELECT NULL WHERE 0),
    recorded (id, status) AS (SELECT NULL, NULL WHERE 0),
    claimable AS MATERIALIZED ({{eligible}})
    {LEASE}
"""

# SQLite: the token bucket as the claim left it.
TOKENS_SPENT = """
    UPDATE webhook_receiver_webhookdestination SET tokens = %s, tokens_at = %s
    WHERE id = %s
"""

# A round that could not be recorded, for the overview and webhook_status (in a
# transaction of its own, after the round's rolled back).
RECORD_FAILED = """
    UPDATE webhook_receiver_webhookdestination SET record_error = %s, record_failed_at = %s
    WHERE id = %s
"""
