"""The relay: claim a destination's eligible messages, send them with no transaction
open, record what each answer means.

A run of one destination (``relay_destination``, run.py):

1. ``relay_claim`` (claim.py): lock the destination's row and count its unexpired leases
   (the requests in flight on every worker), refill its token bucket, and claim as many
   eligible messages as both limits allow, oldest first, with ``FOR UPDATE SKIP
   LOCKED`` on PostgreSQL. A message whose ordering key has an older open message
   waits for it. Each claimed message gets a lease: a worker that dies holds it only
   until the lease ends, and the message is then claimed again, under the same key.
   One statement on PostgreSQL, which returns the destination's row too.
2. The run's window (transport.py): the HTTP requests in flight, on threads kept per
   destination, a client kept per destination (connection reuse). No transaction is
   open while they wait.
3. As answers come, the ones that came are recorded (record.py: delivered, deferred by
   Retry-After or backoff with full jitter, or terminal, as policy.py reads the answer;
   one attempt row each, and the breaker) and their replacements claimed, in one
   statement on PostgreSQL (``relay_record_and_claim``): a slow answer holds its own
   slot and nothing else.

Each statement is bounded by the lock and statement timeouts (outbound/queries.py holds
them), and a run reads nothing else.

Every answer is recordable, whatever the destination sent: the request ends at the
destination's timeout from connect to the last byte kept (``core/peer_http.py``),
and what is stored of it is made fit for its column (``core/storable.py``). A round
that still cannot be recorded whole is recorded answer by answer; an attempt that was
never recorded (a worker killed, a database that refused) is counted against the
message's budget when its lease runs out, so nothing is sent past its budget.

No worker ever sleeps: a deferral is the message's ``next_attempt_at``; a destination
out of tokens is relayed again when its next token is due (``RelayRound.wait``).
"""
