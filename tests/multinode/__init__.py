"""More than one machine, on one: two gunicorn nodes and two Celery workers, each a
process with its own environment as on a machine of its own, all through one PgBouncer
in transaction mode to one PostgreSQL and one Redis (``python -m tests.multinode``).

- ``cluster``: the processes, the database and the servers of a run, and their clean-up;
- ``merchant``: the merchant's endpoint the outbox relays to, which records arrivals;
- ``sender``: the client that spreads signed events over both nodes, duplicates included;
- ``checks``: exactly once, the destination's limits, and every message delivered;
- ``cpu``: who spends the CPU during a run (per process, from ``/proc``);
- ``scenario``: one run and its report; ``measure``: the figures of docs/deploying.md.
"""
