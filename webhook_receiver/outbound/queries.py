"""The outbox's SQL: every statement that admission and the relay write out, each with its
purpose.

Why written out: a relay round is a handful of statements, each read here whole, and
the ORM cannot say ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (how admission learns
whether it created the message) nor ``UPDATE … RETURNING`` over a ``MATERIALIZED`` CTE
(the claim). Statuses come from ``MessageStatus``; datetimes go through
``connection.ops`` (SQLite keeps them as text). RETURNING needs SQLite 3.35 or newer
(system check webhook_receiver.E007). Table names are the models' ``db_table``.
"""

from __future__ import annotations

from .models import MessageStatus

PENDING = MessageStatus.PENDING.value
SENDING = MessageStatus.SENDING.value
FAILED = MessageStatus.FAILED.value

# --- admission ---------------------------------------------------------------------------

# One message per (destination, key), forever: a conflict creates nothing (and leaves the
# first message's metadata as it is: the metadata is not part of the identity).
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
    RETURNING id
"""

# The insert's own lock bound, sent with it (faults.execute_bounded): the transaction's
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

# --- the relay's claim ---------------------------------------------------------------------

# The destination's row, locked (the limiter's state lives on it: one claimer at a
# time), with its requests in flight on every worker: its unexpired leases.
DESTINATION_WITH_IN_FLIGHT = f"""
    SELECT d.*, (
        SELECT count(*) FROM webhook_receiver_outboxmessage m
        WHERE m.destination_id = d.id AND m.status = '{SENDING}' AND m.lease_until > %(now)s
    ) AS in_flight
    FROM webhook_receiver_webhookdestination d
    WHERE d.id = %(destination_id)s
"""

# its locking variants on PostgreSQL, keyed by (vendor, skip_if_busy); SQLite serialises
# writers: its IMMEDIATE transactions do the locking's job with the plain one
LOCKED_DESTINATION = {
    ("postgresql", False): DESTINATION_WITH_IN_FLIGHT + " FOR UPDATE OF d",
    ("postgresql", True): DESTINATION_WITH_IN_FLIGHT + " FOR UPDATE OF d SKIP LOCKED",
}

# Eligible messages of one destination, oldest first: pending and due, or claimed by a
# worker whose lease has run out (the partial index webhook_outbox_open holds just the
# open ones, so delivered history costs nothing). A message waits while an older one
# with its ordering key is still open (pending, sending, or failed until an operator
# acts).
ELIGIBLE_IDS = f"""
    SELECT m.id FROM webhook_receiver_outboxmessage m
    WHERE m.destination_id = %(destination_id)s
      AND m.status IN ('{PENDING}', '{SENDING}')
      AND ((m.status = '{PENDING}' AND m.next_attempt_at <= %(now)s)
           OR (m.status = '{SENDING}' AND m.lease_until <= %(now)s))
      AND (m.ordering_key = '' OR NOT EXISTS (
            SELECT 1 FROM webhook_receiver_outboxmessage o
            WHERE o.destination_id = m.destination_id AND o.ordering_key = m.ordering_key
              AND o.id < m.id AND o.status IN ('{PENDING}', '{SENDING}', '{FAILED}')))
    ORDER BY m.id
    LIMIT %(limit)s
"""

# PostgreSQL: rows another worker is claiming are skipped, not waited for (SQLite: the
# plain one)
ELIGIBLE = {"postgresql": ELIGIBLE_IDS + " FOR UPDATE OF m SKIP LOCKED"}

# The claim: the eligible rows (selected once: MATERIALIZED) take a lease and count an
# attempt, and come back to be sent. One still sending had a lease that ran out: its
# attempt was never recorded (its worker stopped, or the database refused the round), and
# it spends the retry budget as a failure does. When that spends the last of it, the
# message is failed here instead of sent again (SPENT; every SET sees the row as it was).
_SPENT = f"(status = '{SENDING}' AND failures + 1 >= %(max_attempts)s)"
CLAIM = f"""
    WITH claimable AS MATERIALIZED ({{eligible}})
    UPDATE webhook_receiver_outboxmessage
    SET status = CASE WHEN {_SPENT} THEN '{FAILED}' ELSE '{SENDING}' END,
        lease_until = CASE WHEN {_SPENT} THEN NULL ELSE %(lease_until)s END,
        attempts = attempts + CASE WHEN {_SPENT} THEN 0 ELSE 1 END,
        next_attempt_at = CASE WHEN {_SPENT} THEN %(now)s ELSE next_attempt_at END,
        last_error = CASE WHEN {_SPENT} THEN %(unrecorded)s ELSE last_error END,
        failures = failures + CASE WHEN status = '{SENDING}' THEN 1 ELSE 0 END
    WHERE id IN (SELECT id FROM claimable)
    RETURNING id, key, event_type, payload, attempts, failures, created_at, status,
        traceparent
"""

# The token bucket as the claim left it.
TOKENS_SPENT = """
    UPDATE webhook_receiver_webhookdestination SET tokens = %s, tokens_at = %s
    WHERE id = %s
"""

# --- the relay's record ----------------------------------------------------------------

# A round's answers, one UPDATE per distinct outcome (one a round when every answer is
# a 2xx). Only on messages this claim still holds (sending, at this attempt): a worker
# whose lease ran out (frozen, or held by a slow answer) must not undo the claim that
# took over. The ones it changed come back.
RECORD = f"""
    UPDATE webhook_receiver_outboxmessage
    SET status = %s, failures = %s, next_attempt_at = %s, lease_until = NULL,
        delivered_at = %s, last_status_code = %s, last_error = %s
    WHERE id IN ({{ids}}) AND status = '{SENDING}' AND attempts = %s
    RETURNING id
"""

# Every attempt of a round, in one statement.
ATTEMPTS = """
    INSERT INTO webhook_receiver_deliveryattempt (message_id, number, started_at,
        duration_ms, status_code, error, response_excerpt, next_attempt_at)
    VALUES {rows}
"""

# A success closes the destination's breaker.
BREAKER_CLOSED = """
    UPDATE webhook_receiver_webhookdestination
    SET consecutive_failures = 0, paused_until = NULL, last_success_at = %s
    WHERE id = %s
"""

# A round that could not be recorded, for the overview and webhook_status (in a
# transaction of its own, after the round's rolled back).
RECORD_FAILED = """
    UPDATE webhook_receiver_webhookdestination SET record_error = %s, record_failed_at = %s
    WHERE id = %s
"""
