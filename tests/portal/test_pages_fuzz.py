"""What a browser may send the portal's pages, fuzzed (hypothesis): a link's token, the
message log's filters and the forms that act. Whatever it is, the answer is a page
(200, 302, 400, 403, 404, 405), never a 5xx, and nothing is made from a refused one."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.support.outbox import destination
from webhook_receiver.models import WebhookDestination
from webhook_receiver.portal.access import portal_session_open
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import Capability, PortalSession

pytestmark = pytest.mark.django_db

FUZZ = hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ANSWERED = {200, 302, 400, 403, 404, 405}
# what a form field may hold: any text, a number's shape, a date's, JSON's
FIELD = st.one_of(
    st.text(max_size=60),
    st.integers().map(str),
    st.sampled_from(["2026-12-07T08:00", "0001-01-01T00:00", "9999-12-31T23:59", "{}", "[]"]),
    st.sampled_from(['{"data.status": "paid"}', '{"$or": 1}', "1e999", "null", "\x00"]),
)


@pytest.fixture
def session(settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "PORTAL_ACTIONS_PER_MINUTE": 10**6}
    dest = destination("acme-shop", tenant="acme", event_types=["order.*"])
    _, key = portal_session_open("acme", Capability.values, by="fuzz")
    client = Client()
    client.cookies[COOKIE] = key
    return client, dest


@FUZZ
@given(token=st.text(max_size=200))
def test_any_token_opens_nothing_and_is_answered(token):
    answer = Client().post(reverse("webhook_portal:exchange"), {"token": token})
    assert answer.status_code == 403
    assert not PortalSession.objects.exists()


@FUZZ
@given(query=st.dictionaries(st.sampled_from(["endpoint", "event_type", "status", "since",
                                              "until", "page"]), FIELD))  # fmt: skip
def test_any_filter_of_the_message_log_is_answered(session, query):
    client, _ = session
    answer = client.get(reverse("webhook_portal:messages"), query)
    assert answer.status_code in ANSWERED, answer.content[:300]


@FUZZ
@given(form=st.dictionaries(st.sampled_from(["url", "description", "event_types", "filter"]),
                            FIELD))  # fmt: skip
def test_any_endpoint_form_is_saved_or_refused(session, form):
    client, dest = session
    before = WebhookDestination.objects.count()
    answer = client.post(reverse("webhook_portal:endpoint_edit", args=[dest.pk]), form)
    assert answer.status_code in ANSWERED, answer.content[:300]
    assert WebhookDestination.objects.count() == before


@FUZZ
@given(form=st.dictionaries(st.sampled_from(["kind", "since", "until", "event_types",
                                             "answer_classes", "ordering_key_prefix", "rate",
                                             "plan"]), FIELD))  # fmt: skip
def test_any_recovery_plan_form_is_answered(session, form):
    client, dest = session
    answer = client.post(reverse("webhook_portal:endpoint_recover", args=[dest.pk]), form)
    assert answer.status_code in ANSWERED, answer.content[:300]
