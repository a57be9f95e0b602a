"""The relay: the outbox's messages sent to their destinations, each answer recorded.

- engine.py: a relay process's one event loop; every destination with work a lane on it,
  a fixed number of database connections, one scheduler (what wakes a lane: wakeups.py).
- round.py: a round, for any number of destinations: their rows locked and read, what
  their limits allow decided in Python (limits.py, policy.py; the breaker in
  ../breaker.py), the answers recorded and the next messages claimed in one statement
  (writes.py); steps.py when the database refuses it.
- transport.py: each message signed and sent with no transaction open, over by its
  destination's timeout from connect to the last byte kept, only to addresses the
  egress guard allows.
- reporting.py: the lines, notices and counters a round leaves.
- process.py: ``manage.py webhook_relay``'s process, and one destination relayed on the
  caller's connection.

No relay ever sleeps for a message: a deferral is its ``next_attempt_at``, a destination
out of tokens a timer on its lane, and a relay that dies leaves its messages leased, to
be claimed again under their keys when the leases run out.
"""
