"""OpenTelemetry (core/tracing.py), with the SDK's in-memory exporter: one inbound
order.paid that is forwarded makes one trace, from the sender's traceparent to the
merchant's request, with the expected spans and links; no span carries a secret, a
signature or a body."""

from __future__ import annotations

import json

import pytest
from django.db.models import Sum
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.settings import SHOP_SECRET
from tests.support.fuzzing import THROUGH_THE_DATABASE, texts
from tests.support.http import post
from tests.support.signing import standard_headers
from webhook_receiver.models import (
    OutboxMessage,
    RejectionTally,
    RequestAudit,
    WebhookDestination,
)
from webhook_receiver.outbound.relay.process import relay_destination

pytestmark = pytest.mark.django_db

SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
MERCHANT_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# the spans of one event from its request to its delivery, in that order
SPANS = (
    "webhook.receive",
    "webhook.verify",
    "webhook.claim",
    "webhook.handler",
    "webhook.relay_round",
    "webhook.deliver",
)

_exporter = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans():
    """The process's tracer provider (set once: OpenTelemetry allows no second), whose
    exporter stops keeping spans once this module is done."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    yield _exporter
    _exporter.clear()
    _exporter.shutdown()


def test_one_forwarded_order_is_one_trace_from_the_sender_to_the_merchant(spans, receiver):
    # given: a merchant subscribed to order.paid, and a sender whose request is traced
    WebhookDestination.objects.create(
        name="merchant", url=receiver.url, secrets=[MERCHANT_SECRET], event_types=["order.paid"]
    )
    spans.clear()
    body = json.dumps({"type": "order.paid", "data": {"order_id": "ord_t", "version": 1}}).encode()
    headers = standard_headers(body, msg_id="msg_traced")
    headers["traceparent"] = f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"
    headers["baggage"] = "user=someone"

    # when: it is received, then relayed
    answer = post(Client(), "shop", body, headers)
    assert answer.json()["status"] == "applied", answer.content
    message = OutboxMessage.objects.get()
    sent, _ = relay_destination(destination_id=message.destination_id)

    # then: one trace, the sender's, through every span
    assert sent == 1
    finished = {span.name: span for span in spans.get_finished_spans()}
    assert set(finished) >= set(SPANS)
    receive, verify, claim, handler, round_, deliver = (finished[name] for name in SPANS)
    sender_trace = int(SENDER_TRACE, 16)
    assert receive.kind == trace.SpanKind.SERVER
    assert receive.parent.span_id == int(SENDER_SPAN, 16)
    for span in (receive, verify, claim, handler, deliver):
        assert span.context.trace_id == sender_trace, span.name
    assert verify.parent.span_id == receive.context.span_id
    assert claim.parent.span_id == receive.context.span_id
    assert handler.parent.span_id == claim.context.span_id
    # and: the message kept the handler's context; its delivery is that span's child,
    # the round (another trace, the relay's) links to it
    assert message.traceparent == f"00-{SENDER_TRACE}-{handler.context.span_id:016x}-01"
    assert deliver.kind == trace.SpanKind.CLIENT
    assert deliver.parent.span_id == handler.context.span_id
    assert [link.context.span_id for link in round_.links] == [handler.context.span_id]
    # and: the merchant's request goes on from the delivery's span
    [request] = receiver.received
    assert request.headers["traceparent"] == (
        f"00-{SENDER_TRACE}-{deliver.context.span_id:016x}-01"
    )
    assert "baggage" not in request.headers
    # and: what the spans say
    assert receive.attributes["webhook.result"] == "applied"
    assert receive.attributes["webhook.event_key"] == "msg_traced"
    assert deliver.attributes["webhook.status_code"] == 200
    assert deliver.attributes["webhook.message_key"] == message.key

    # then: nothing secret, signed or sent in any span
    forbidden = [
        SHOP_SECRET,
        MERCHANT_SECRET,
        headers["webhook-signature"],
        request.headers["webhook-signature"],
        body.decode(),
        '"order_id"',
        "someone",
    ]
    for span in spans.get_finished_spans():
        text = json.dumps(
            {
                "attributes": dict(span.attributes or {}),
                "events": [dict(e.attributes or {}) for e in span.events],
                "status": span.status.description or "",
            }
        )
        for secret in forbidden:
            assert secret not in text, (span.name, secret)


def test_a_refused_request_is_a_failed_span_that_names_the_refusal_only(spans):
    spans.clear()
    body = b'{"type": "order.paid", "data": {"order_id": "ord_forged", "version": 1}}'
    headers = {**standard_headers(body), "webhook-signature": "v1,AAAA"}

    answer = post(Client(), "shop", body, headers)

    assert answer.status_code == 401
    [receive] = [s for s in spans.get_finished_spans() if s.name == "webhook.receive"]
    assert receive.status.status_code == trace.StatusCode.ERROR
    assert receive.status.description == "InvalidSignature"
    assert "ord_forged" not in json.dumps(dict(receive.attributes or {}))


def accounted() -> int:
    """Requests on the record: audit records, and refusals past the audit bound that
    their minute's tally counts."""
    unrecorded = RejectionTally.objects.aggregate(n=Sum("unrecorded"))["n"] or 0
    return RequestAudit.objects.count() + unrecorded


def traceparents() -> st.SearchStrategy[str]:
    """Trace context a sender may send: well-formed, nearly so, or anything at all."""
    hexes = st.text("0123456789abcdefABCDEF", min_size=0, max_size=40)
    near = st.builds(lambda v, t, s, f: f"{v}-{t}-{s}-{f}", hexes, hexes, hexes, hexes)
    return st.one_of(near, texts("latin1", max_size=600))


@THROUGH_THE_DATABASE
@given(traceparent=traceparents(), tracestate=texts("latin1", max_size=600), bad=st.booleans())
def test_any_trace_context_a_sender_sends_is_answered_and_audited_never_a_5xx(
    spans, traceparent, tracestate, bad
):
    # given: a request, authentic or not, with whatever trace context
    body = json.dumps({"type": "test.noop", "data": {"id": "x"}}).encode()
    headers = standard_headers(body)
    if bad:
        headers["webhook-signature"] = "v1,AAAA"
    headers |= {"traceparent": traceparent, "tracestate": tracestate}
    audits = accounted()

    # when
    answer = post(Client(), "shop", body, headers)

    # then: answered as without it, on the record, in one span that holds only the
    # app's own attributes
    assert answer.status_code == (401 if bad else 200), answer.content
    assert accounted() == audits + 1
    [receive] = [s for s in spans.get_finished_spans() if s.name == "webhook.receive"][-1:]
    assert set(receive.attributes or {}) <= {
        "webhook.source",
        "webhook.event_key",
        "webhook.result",
    }
    spans.clear()
