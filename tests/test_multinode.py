"""More than one machine, on one: two gunicorn nodes and two relays (and a Celery worker),
each with an environment of its own, through one PgBouncer in transaction mode to one
PostgreSQL and one Redis; PgBouncer restarted under them mid-run (``tests/multinode``,
small).

Every event is applied once however many nodes it reached (duplicates went to both at
once); the destination's rate and concurrency limits hold across both relays; every
message arrives, each order's in order; the requests that failed during the restart
were sent again by the sender, and nothing was lost or doubled.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from tests.multinode.cluster import Layout, pgbouncer_binary, postgres_answers
from tests.multinode.scenario import Options, report_lines, run

pytestmark = pytest.mark.postgres_only("one PostgreSQL behind PgBouncer, as deployed")


def test_two_nodes_and_two_relays_through_one_pooler_apply_and_relay_each_event_once():
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("needs PostgreSQL: one PostgreSQL behind PgBouncer, as deployed")
    if pgbouncer_binary() is None:
        pytest.skip("needs pgbouncer (apt-get install pgbouncer; .ci/run installs it)")
    if not postgres_answers():
        pytest.skip("needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust)")
    began = time.monotonic()
    options = Options(
        events=240,
        threads=8,
        restart_at=0.2,
        down_seconds=1.0,
        rate=40,
        burst=10,
        concurrency=3,
        timeout=1.0,  # a round lost in the restart is sent again after 1 + 24 s
        merchant_delay=0.02,
        layout=Layout(
            nodes=2, web_workers=2, relays=2, workers=1, worker_concurrency=2, pool_size=6
        ),
    )

    report = run(options)

    text = "\n".join(report_lines(report)) + "\n" + report.get("logs", "")
    assert report["problems"] == [], text
    assert report["restart"]["restarted"], text
    # the sender reached both nodes, and sent every duplicate to both
    assert all(count > 0 for count in report["receive"]["per_node"].values()), text
    assert report["receive"]["answers"].get("200 duplicate", 0) > 0, text
    assert report["relay"]["most_in_flight"] <= options.concurrency, text
    assert time.monotonic() - began < 90, text
