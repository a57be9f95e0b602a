"""The receive path's SQL: every statement a delivery runs, each with its purpose.

Parameters are named, and one dict per delivery holds them all (``claim._params``): the
receipt's columns, the audit record's (the two share source, event key, message id,
signature timestamp and receipt time, which are the same values), the ids and results
that the later statements need, and the bounds. On PostgreSQL a delivery's first
statement (the claim) is sent after ``bounds.BOUND``, in the same round trip: its lock
and statement timeouts bound that statement and the claim's transaction.
Table names are the models' ``db_table`` (a test checks them). Statements run on
PostgreSQL and SQLite alike unless their comment says otherwise: only PostgreSQL lets
one statement insert into two tables.

Why raw SQL here: the ORM cannot say ``INSERT … ON CONFLICT DO NOTHING RETURNING``,
which is how the claim learns whether it won; and for statements this small its
machinery costs more CPU than the database's work.

On PostgreSQL, a parameter must keep one type within a statement: a value that goes
into a column in one place and is compared in another (source, event key) is written
once and read back from the row where needed.
"""

from __future__ import annotations

from .models import FailureStatus, Result

DUPLICATE = Result.DUPLICATE.value
# a failed event in one of these is still open: a success resolves it
OPEN = (FailureStatus.RETRYING, FailureStatus.DEAD, FailureStatus.DISCARDED)
OPEN_FAILURES = ", ".join(f"'{status}'" for status in OPEN)

# An audit record's columns, and the request's values for all but its result and status
# (every INSERT of one names them in this order).
_AUDIT = """INSERT INTO webhook_receiver_requestaudit (
        source, message_id, event_key, signature_timestamp, verification,
        body_sha256, body_size, remote_addr, received_at, secret_fingerprint,
        result, response_status
    )"""
_REQUEST = """%(source)s, %(message_id)s, %(event_key)s, %(signature_timestamp)s, %(verification)s,
        %(body_sha256)s, %(body_size)s, %(remote_addr)s, %(received_at)s,
        %(secret_fingerprint)s"""

_INSERT_RECEIPT = """
    INSERT INTO webhook_receiver_webhookreceipt (
        source, event_key, event_type, message_id, signature_timestamp,
        status, subject, outcome, body, headers, received_at
    ) VALUES (
        %(source)s, %(event_key)s, %(event_type)s, %(message_id)s, %(signature_timestamp)s,
        %(status)s, %(subject)s, %(outcome)s, %(body)s, %(headers)s, %(received_at)s
    )
    ON CONFLICT (source, event_key) DO NOTHING
"""
_HAS_OPEN_FAILURE = f"""
    EXISTS (
        SELECT 1 FROM webhook_receiver_failedevent
        WHERE source = %(source)s AND event_key = %(event_key)s AND status IN ({OPEN_FAILURES})
    )
"""

# A duplicate's answer where the claim statement did not return it (SQLite, retries and
# replays, a receipt committed after the claim's snapshot): the key's stored outcome.
READ_OUTCOME = """
    SELECT outcome FROM webhook_receiver_webhookreceipt
    WHERE source = %(source)s AND event_key = %(event_key)s
"""

# The claim (PostgreSQL), for a request: insert the receipt unless its key is taken, and
# write the delivery's audit record, with the expected result or as a duplicate. Returns
# the receipt's id (NULL: the key was taken), whether the key is held as a failed event,
# the audit record's id, and a duplicate's stored outcome (NULL when the receipt was
# committed by a concurrent claim after this statement's snapshot: read it again).
# Every claim commits durably, a duplicate's too: its audit record is what an operator
# reads of the delivery.
CLAIM_AUDITED = f"""
    WITH claimed AS ({_INSERT_RECEIPT} RETURNING id),
    audited AS (
        {_AUDIT} VALUES (
            {_REQUEST},
            CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN %(result)s ELSE '{DUPLICATE}' END, 200
        )
        RETURNING id
    )
    SELECT
        (SELECT id FROM claimed),
        {_HAS_OPEN_FAILURE},
        (SELECT id FROM audited),
        (SELECT outcome FROM webhook_receiver_webhookreceipt
         WHERE NOT EXISTS (SELECT 1 FROM claimed)
           AND source = %(source)s AND event_key = %(event_key)s)
"""

# The claim (PostgreSQL) for retries and replays: the receipt alone. Returns the
# receipt's id (NULL: the key was taken) and whether the key is held as a failed event.
CLAIM = f"""
    WITH claimed AS ({_INSERT_RECEIPT} RETURNING id)
    SELECT (SELECT id FROM claimed), {_HAS_OPEN_FAILURE}
"""

# The claim (SQLite), with or without a request: as CLAIM, but no row at all when the
# key was taken (SQLite's RETURNING answers only for the rows it inserted).
CLAIM_SQLITE = f"{_INSERT_RECEIPT} RETURNING id, {_HAS_OPEN_FAILURE}"

# A handler's result differs from the one the receipt went in with: correct the receipt…
UPDATE_RECEIPT_RESULT = """
    UPDATE webhook_receiver_webhookreceipt
    SET status = %(status)s, subject = %(subject)s, outcome = %(outcome)s
    WHERE id = %(receipt_id)s
"""
# … and the audit record that the claim wrote with it.
UPDATE_AUDIT_RESULT = """
    UPDATE webhook_receiver_requestaudit SET result = %(result)s WHERE id = %(audit_id)s
"""

# An audit record on its own: a rejected request, a captured failure, a claim on SQLite.
INSERT_AUDIT = f"""
    {_AUDIT} VALUES ({_REQUEST}, %(result)s, %(response_status)s)
"""

# A refused request: count it in its minute's tally for its source and reason, and say
# whether it is among the first %(keep)s of that tally, which get an audit record; beyond,
# the tally's ``unrecorded`` counts it instead. The upsert's row lock orders concurrent
# refusals, so each is counted once, and records + unrecorded = requests, exactly.
_TALLY_REFUSAL = """
    INSERT INTO webhook_receiver_rejectiontally AS tally
        (minute, source, reason, requests, unrecorded)
    VALUES (%(minute)s, %(tally_source)s, %(reason)s, 1, 0)
    ON CONFLICT (minute, source, reason) DO UPDATE SET
        requests = tally.requests + 1,
        unrecorded = tally.unrecorded + CASE WHEN tally.requests < %(keep)s THEN 0 ELSE 1 END
"""
# SQLite: the tally alone; INSERT_AUDIT follows in the same transaction if it says so.
TALLY_REFUSAL_SQLITE = f"{_TALLY_REFUSAL} RETURNING requests <= %(keep)s"
# PostgreSQL: the tally and the record in one statement. Writes one audit row or none
# (the cursor's rowcount).
_RECORD_REFUSAL = f"""
    WITH tallied AS (
        {_TALLY_REFUSAL}
        RETURNING requests <= %(keep)s AS recorded{{relax}}
    )
    {_AUDIT}
    SELECT {_REQUEST}, %(result)s, %(response_status)s
    FROM tallied WHERE recorded
"""
RECORD_REFUSAL = _RECORD_REFUSAL.format(relax="")
# The same, run as a transaction of its own (autocommit), which then commits without
# waiting for its WAL flush. A flood's refusals all update one row, whose lock would
# otherwise be held through each commit's flush, one refusal after the other (measured:
# a third of the throughput, three times the latency). A refusal changes no business
# state; a database crash may lose the last fraction of a second of them, tally and
# record together. (A column of its own, so that it is evaluated for every row.)
RECORD_REFUSAL_RELAXED = _RECORD_REFUSAL.format(
    relax=",\n        set_config('synchronous_commit', 'off', true) AS relaxed"
)
