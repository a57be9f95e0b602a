"""/metrics/ served as deployed, by two gunicorn sync workers in prometheus-client's
multiprocess mode: whichever worker answers a scrape, each request is counted once, and
a restart on the same directory starts the counters again from zero."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from prometheus_client.multiprocess import MultiProcessCollector

from tests.bench.server import GUNICORN_WSGI, free_port
from tests.settings import SHOP_SECRET
from tests.support.metrics import TOKEN, Samples, parse, value
from tests.support.paths import REPO
from tests.support.served import wait_listening
from tests.support.signing import reserved, standard_headers
from webhook_receiver.models import WebhookReceipt
from webhook_receiver.watch.traffic import last_accepted_at


class Gunicorn:
    """``project.wsgi`` under gunicorn with deploy/gunicorn.conf.py, as deployed."""

    def __init__(self, metrics_dir: Path, log: Path, workers: int = 2) -> None:
        db = connection.settings_dict
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
        self.port = free_port()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": url,
            "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
            "METRICS_TOKEN": TOKEN,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "DEMO_VAR_DIR": str(log.parent / "var"),
        }
        self.env.pop("GUNICORN_CMD_ARGS", None)
        self.command = [
            *GUNICORN_WSGI,
            "-c",
            str(REPO / "deploy" / "gunicorn.conf.py"),
            "-w",
            str(workers),
            "--bind",
            f"127.0.0.1:{self.port}",
        ]
        self.log = log

    def __enter__(self) -> Gunicorn:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_listening(self.port, seconds=30)
        return self

    def __exit__(self, *exc_info) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def request(self, method: str, path: str, body: bytes = b"", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(
                method, path, body=body, headers={**(headers or {}), "Connection": "close"}
            )
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def scrape(self) -> Samples:
        status, content = self.request(
            "GET", "/metrics/", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        # a failed scrape shows what the server logged (its traceback, its bound)
        assert status == 200, content[:500] + b"\n" + self.log.read_bytes()[-4000:]
        return parse(content.decode())


def applied_per_file(metrics_dir: Path) -> dict[str, float]:
    """Each process's own count of applied shop events, from its counter file."""
    counts = {}
    for path in sorted(metrics_dir.glob("counter_*.db")):
        for metric in MultiProcessCollector.merge([str(path)]):
            for sample in metric.samples:
                if sample.name == "webhook_receiver_events_total" and sample.labels == {
                    "source": "shop",
                    "result": "applied",
                }:
                    counts[path.name] = sample.value
    return counts


@pytest.mark.postgres_only("gunicorn serves the test database from other processes")
@pytest.mark.django_db(transaction=True)
def test_two_gunicorn_workers_count_every_request_once_in_every_scrape(tmp_path):
    metrics_dir = tmp_path / "prometheus"
    batch = 20
    with Gunicorn(metrics_dir, tmp_path / "gunicorn.log") as server:

        def send(body: bytes) -> int:
            return server.request("POST", "/webhooks/shop/", body, standard_headers(body))[0]

        # when: signed requests, four at a time, in batches until both workers have
        # served some (one may still be starting when the first arrive)
        sent = 0
        with ThreadPoolExecutor(max_workers=4) as pool:
            for number in range(10):
                bodies = [reserved(f"ord_{number}_{i}", ("SKU-1", 1)) for i in range(batch)]
                assert list(pool.map(send, bodies)) == [200] * batch
                sent += batch
                if len([c for c in applied_per_file(metrics_dir).values() if c > 0]) == 2:
                    break
        scrapes = [server.scrape() for _ in range(12)]

        # then: every scrape, whichever worker answered it, counts each request once
        for samples in scrapes:
            applied = value(
                samples, "webhook_receiver_events_total", source="shop", result="applied"
            )
            assert applied == sent
            assert value(samples, "webhook_receiver_receive_seconds_count", source="shop") == sent
        # the DB-backed gauges too
        last = value(scrapes[0], "webhook_receiver_last_event_timestamp_seconds", source="shop")
        assert last == pytest.approx(last_accepted_at("shop").timestamp(), abs=1e-3)
        # and the requests were spread over both workers, each with its own file
        per_process = applied_per_file(metrics_dir)
        assert sum(per_process.values()) == sent
        assert len([c for c in per_process.values() if c > 0]) == 2, per_process

    # when: the server restarts on the same directory, that run's files still in it
    assert list(metrics_dir.glob("counter_*.db"))
    with Gunicorn(metrics_dir, tmp_path / "gunicorn.log") as server:
        samples = server.scrape()

    # then: the counters start again from zero (Prometheus reads that as a reset)
    assert value(samples, "webhook_receiver_events_total", source="shop", result="applied") == 0
    assert WebhookReceipt.objects.filter(source="shop").count() == sent
