"""The Grafana dashboard shipped in deploy/grafana/: it loads, holds the panels an
operator opens first in their order, each described and queried, and every metric its
panels and variables name is one a real scrape of /metrics/ exports."""

from __future__ import annotations

import json
import re

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import post
from tests.support.metrics import AUTH
from tests.support.paths import REPO
from tests.support.reconciling import needs_repair_run
from tests.support.signing import reserved, standard_headers
from tests.support.status import repair
from webhook_receiver.models import (
    FailedEvent,
    FailureStatus,
    RepairKind,
    SilenceAlert,
    WebhookDestination,
)
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination

DASHBOARD = REPO / "deploy" / "grafana" / "webhook_receiver.json"
METRIC = re.compile(r"webhook_receiver_[a-z_]+")
LABEL_VALUES = re.compile(r"^label_values\(\s*(webhook_receiver_[a-z_]+)\s*,\s*([a-z_]+)\s*\)$")

# the panels an operator opens first, in order: the metrics each one's queries name
PANELS_IN_ORDER = [
    {"webhook_receiver_events_total"},
    {"webhook_receiver_rejected_total"},
    {"webhook_receiver_rejected_unrecorded_total"},
    {"webhook_receiver_receive_seconds_bucket"},
    {"webhook_receiver_failed_events"},  # retrying
    {"webhook_receiver_oldest_retry_age_seconds"},
    {"webhook_receiver_failed_events"},  # dead
    {"webhook_receiver_silence_alert_open"},
    {"webhook_receiver_last_event_timestamp_seconds"},
    {"webhook_receiver_outbox_backlog", "webhook_receiver_outbox_held_back"},
    {"webhook_receiver_outbox_oldest_eligible_age_seconds"},
    {"webhook_receiver_outbox_delivery_seconds_bucket"},
    {"webhook_receiver_outbox_breaker_open"},
    {"webhook_receiver_outbox_failed", "webhook_receiver_outbox_terminal_total"},
    {"webhook_receiver_outbox_uncatalogued_total"},
    {"webhook_receiver_repair_items_open"},
]

# the sample names each metric type gives its family's name
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """The queried panels, rows left out (a collapsed row holds its panels inside)."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variable_query(variable: dict) -> str:
    query = variable["query"]
    return query["query"] if isinstance(query, dict) else query


# --- (a) the dashboard itself -----------------------------------------------------------


def test_the_dashboard_has_the_panels_in_order_each_described_and_queried():
    dashboard = load()

    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    queried = panels(dashboard)
    for panel in queried:
        assert panel.get("title"), panel
        assert panel.get("description", "").strip(), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], panel["title"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert [set(METRIC.findall(_exprs(p))) for p in queried] == PANELS_IN_ORDER
    # six rows above them, in the same order
    rows = [p["title"].split(":")[0] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Receiving",
        "Receive time",
        "Retries and dead letters",
        "Silence",
        "Outbox",
        "Reconciliation",
    ]
    # ids unique, and no two panels overlap on the 24-column grid
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cell = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & cell, panel["title"]
        cells |= cell


def test_the_variables_choose_the_datasource_the_sources_and_the_destinations():
    dashboard = load()
    found = variables(dashboard)

    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    for name, label in (("source", "source"), ("destination", "destination")):
        variable = found[name]
        assert variable["type"] == "query"
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        match = LABEL_VALUES.match(variable_query(variable))
        assert match and match[2] == label, variable_query(variable)
        # "All" is a regex that matches every value, the unknown source's refusals too
        assert variable["includeAll"] and variable["allValue"] == ".*"
    # each panel filters by the variable of its label
    for panel in panels(dashboard):
        for target in panel["targets"]:
            label = "destination" if "outbox" in target["expr"] else "source"
            assert f'{label}=~"${label}"' in target["expr"], (panel["title"], target["expr"])


def test_every_query_is_valid_promql(tmp_path):
    """With Prometheus' own checker, each panel's query as Grafana sends it (its variables
    at "All"), written as a recording rule."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package)")
    grafana = {"$source": ".*", "$destination": ".*", "$__rate_interval": "5m"}
    rules = []
    for n, target in enumerate(t for p in panels(load()) for t in p["targets"]):
        expr = target["expr"]
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    # JSON is YAML: no YAML library needed
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))

    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stdout + result.stderr


def _exprs(panel: dict) -> str:
    return "\n".join(target["expr"] for target in panel["targets"])


# --- (b), (c) the metrics it names are the ones /metrics/ exports -------------------------


@pytest.mark.django_db
def test_every_metric_the_dashboard_names_is_exported_by_a_real_scrape(
    client, metrics_on, receiver, django_capture_on_commit_callbacks
):
    # given: something of every kind the metrics count or read, so that every family
    # shows with samples: a request through the endpoint (counters, the histogram, the
    # last event), one refused, a retrying and a dead failed event, an open silence alert,
    # an open repair item, and a destination whose relay delivered one message, saw one
    # terminal and one duplicate admission
    now = timezone.now()
    body = reserved("ord_1", ("SKU-1", 1))
    assert post(client, "shop", body, standard_headers(body, msg_id="gf_1")).status_code == 200
    assert post(client, "shop", body, {}).status_code == 400
    for key, status, due in (
        ("gf_r", FailureStatus.RETRYING, now),
        ("gf_d", FailureStatus.DEAD, None),
    ):
        FailedEvent.objects.create(
            source="stripe",
            event_key=key,
            status=status,
            body=b"{}",
            first_attempt_at=now,
            last_attempt_at=now,
            next_attempt_at=due,
        )
    SilenceAlert.objects.create(
        source="github", opened_at=now, silence_after_seconds=1200, last_checked_at=now
    )
    repair("shop", RepairKind.MISSING, "gf_missing", needs_repair_run(now))
    dest = WebhookDestination.objects.create(name="grafana-merchant", url=receiver.url)
    for key in ("k1", "k1", "k2"):  # the second k1 is a dedup hit
        with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
            enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})
    receiver.answer(404, key="k2")
    with django_capture_on_commit_callbacks(execute=True):
        relay_destination(destination_id=dest.pk)

    # when: /metrics/ is scraped
    response = client.get("/metrics/", **AUTH)
    assert response.status_code == 200, response.content
    families = list(text_string_to_metric_families(response.content.decode()))

    # then: the names it exports are each family's, with its type's suffixes, and those
    # with a sample in this scrape
    exported = {
        family.name + suffix for family in families for suffix in SUFFIXES.get(family.type, ("",))
    }
    sampled = {sample.name for family in families for sample in family.samples}
    assert sampled <= exported, sampled - exported
    labels_of: dict[str, set[str]] = {}
    for family in families:
        for sample in family.samples:
            labels_of.setdefault(sample.name, set()).update(sample.labels)

    # (b) every name in any panel's expression, and anywhere in the file, is exported and
    # has samples: the data above made every family the dashboard reads show
    dashboard = load()
    in_panels = {name for panel in panels(dashboard) for name in METRIC.findall(_exprs(panel))}
    assert in_panels - exported == set()
    assert in_panels - sampled == set()
    assert set(METRIC.findall(DASHBOARD.read_text())) - exported == set()
    # and every family of the app's has a panel, but for the few the panels beside them
    # already tell (a new metric fails here until it has a panel or joins this list)
    shown = {
        family.name
        for family in families
        if {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))} & in_panels
    }
    ours = {
        family.name
        for family in families
        # prometheus-client's text format gives each counter and histogram a gauge of
        # its series' creation times: not a metric for a panel
        if family.name.startswith("webhook_receiver_") and not family.name.endswith("_created")
    }
    # (the 0/1 states for alerts: the ages of the oldest retry and message show them)
    assert ours - shown == {
        "webhook_receiver_retries_stalled",
        "webhook_receiver_outbox_not_sending",
        "webhook_receiver_outbox_dedup_hits",
        "webhook_receiver_outbox_in_flight",
        "webhook_receiver_outbox_limiter_utilisation",
        "webhook_receiver_outbox_attempts_per_delivery",
    }

    # (c) every template variable's query reads an exported metric, and a label it has
    for variable in variables(dashboard).values():
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable_query(variable))
        assert match, variable_query(variable)
        metric, label = match[1], match[2]
        assert metric in sampled, metric
        assert label in labels_of[metric], (metric, label)
