"""``make chaos``: a fault run on real processes before a deploy.

gunicorn (several workers), a Celery worker and beat, a PostgreSQL cluster and a Redis of
the run's own; a sender process posting signed shop events as an at-least-once sender
would; a merchant receiver for the outbox; faults in sequence (SIGKILLs, a database
stopped and started, Redis restarted, tables locked, a long snapshot); then every effect
checked against what was sent. ``python -m tests.chaos [--short] [--events N] [--out
FILE]``; docs/testing.md#the-fault-run-make-chaos explains it and its report.
"""
