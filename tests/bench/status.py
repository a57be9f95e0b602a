"""The status readings in ``make bench-metrics`` (tests/bench/metrics.py): the outbox
filled with a million messages, as after a fault run with a hanging and a failing
destination, and ``webhook_status --json`` and the admin's overview timed on the same
tables as the scrape, each against a floor measured in the same run: as many
``SELECT 1`` round trips as it runs statements, interleaved with it.
"""

from __future__ import annotations

import functools
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

# webhook_status: a third of STATUS_TIMEOUT_SECONDS (3 s), the bound it answers within;
# the overview, which adds the traffic's chart and gaps (watch/traffic.py): that bound
TARGETS_MS = {"webhook_status --json": 1000.0, "the overview": 3000.0}


def outbox_fill(connection, messages: int) -> dict[str, int]:
    """``messages`` over ten days to three destinations, an order's few messages sharing
    its ordering key: all of "healthy"'s delivered; of the newest 3 %, "hanging"'s
    pending (a few in flight) and "failing"'s pending, retried (due from five minutes ago
    to five ahead), one in fifty failed and holding its order's later ones back."""
    newest = messages - messages * 3 // 100
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_receiver_webhookdestination (name, url, secrets, event_types,
                rate_count, rate_seconds, burst, max_in_flight, timeout_seconds, max_attempts,
                backoff_base_seconds, backoff_cap_seconds, retry_after_cap_seconds,
                breaker_threshold, breaker_cooldown_seconds, enabled, replay_horizon_days,
                tokens, consecutive_failures, record_error, disabled_reason, created_at,
                updated_at, last_success_at)
            SELECT name, 'https://merchant.example/' || name, '[]'::jsonb,
                '["order.paid"]'::jsonb, 10, 1, 10, 4, 10, 12, 2, 3600, 300, 10, 60, true, 30,
                0, 0, '', '', now(), now(), now() - interval '2 seconds'
            FROM unnest(ARRAY['healthy', 'hanging', 'failing']) AS name
            """
        )
        cursor.execute(
            f"""
            INSERT INTO webhook_receiver_outboxmessage (destination_id, key, event_type,
                payload, metadata, ordering_key, status, attempts, failures, next_attempt_at,
                lease_until, origin_source, origin_event_key, created_at, delivered_at,
                last_error, discarded_by, discard_reason, traceparent)
            SELECT d.id, 'order:' || n || ':v1', 'order.paid', '{{}}'::jsonb, '{{}}'::jsonb,
                'order:' || (n / 5),
                CASE WHEN n <= {newest} OR d.name = 'healthy' THEN 'delivered'
                     WHEN d.name = 'hanging' AND n > {messages} - 10 THEN 'sending'
                     WHEN d.name = 'failing' AND n % 50 = 0 THEN 'failed'
                     ELSE 'pending' END,
                1, 0,
                CASE WHEN d.name = 'failing' THEN now() + (n % 600 - 300) * interval '1 second'
                     ELSE now() - ({messages} - n) * interval '10 ms' END,
                CASE WHEN d.name = 'hanging' AND n > {messages} - 10
                     THEN now() + interval '30 seconds' END,
                'shop', 'evt_' || n, now() - ({messages} - n) * (interval '10 days' / {messages}),
                CASE WHEN n <= {newest} OR d.name = 'healthy'
                     THEN now() - ({messages} - n) * (interval '10 days' / {messages}) END,
                '', '', '', ''
            FROM generate_series(1, {messages}) AS n
            JOIN webhook_receiver_webhookdestination d
              ON d.name = (ARRAY['healthy', 'hanging', 'failing'])[1 + n % 3]
            """
        )
        cursor.execute(
            "SELECT status, count(*) FROM webhook_receiver_outboxmessage GROUP BY status"
        )
        return dict(cursor.fetchall())


def status_bench(connection, runs: int, round_trips: Callable[[int], None]) -> bool:
    """Time webhook_status and the overview; print each against its floor. Returns
    whether both are within their TARGETS_MS."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    admin = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(admin)
    overview = reverse("admin:webhook_receiver_sourceoverview_changelist")

    def status() -> None:
        out = io.StringIO()
        try:
            call_command("webhook_status", "--json", stdout=out)
        except SystemExit as exit:
            assert exit.code in (0, 1, 2), out.getvalue()[:300]  # 3: could not read

    def page() -> None:
        response = client.get(overview)
        assert response.status_code == 200, response.content[:300]

    within = True
    print()
    for name, fn in (("webhook_status --json", status), ("the overview", page)):
        statements = _statements(connection, fn)
        for _ in range(2):  # warm-up
            fn()
        timed, floors = [], []
        n = len(statements)
        for _ in range(runs):
            timed.append(_timed(fn))
            floors.append(_timed(functools.partial(round_trips, n)))
        ms, floor = statistics.median(timed) * 1000, statistics.median(floors) * 1000
        within = within and ms < TARGETS_MS[name]
        print(f"{name}")
        print(f"  median      {ms:7.2f} ms  of {runs} (target < {TARGETS_MS[name]:.0f})")
        print(f"  slowest     {max(timed) * 1000:7.2f} ms")
        print(f"  floor       {floor:7.2f} ms  ({len(statements)} SELECT 1 round trips)")
        print(f"  ratio       {ms / floor:7.2f}     ({name} / floor)")
        slow = [(_explain(connection, sql, params), sql) for sql, params in statements]
        for took, sql in sorted(slow, key=lambda s: s[0], reverse=True)[:3]:
            print(f"  {took:7.2f} ms  {' '.join(sql.split())[:90]}")
    return within


def _statements(connection, fn: Callable[[], None]) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def record(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()
    # the bounds each reading sets (SET LOCAL …) are not reads
    return [(sql, params) for sql, params in seen if sql.lstrip().upper().startswith("SELECT")]


def _explain(connection, sql: str, params: Any) -> float:
    """The statement's execution time in the database (ms), by EXPLAIN ANALYZE."""
    import json

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    return (json.loads(document) if isinstance(document, str) else document)[0]["Execution Time"]


def _timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
