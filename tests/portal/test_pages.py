"""The portal's server-rendered pages (portal/pages/), through Django's test client with a
real portal session: who sees what (each page for its capability, no action button for a
read-only session, answers' text only for who may manage endpoints), what each action
does and records (a PortalAction each), and the headers and markup every page carries.
Another tenant's ids are tests/portal/test_cross_tenant.py's."""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework import serializers

from tests.support.outbox import OLD_SECRET, SECRET, destination, failed, message
from webhook_receiver.models import (
    DeliveryAttempt,
    MessageStatus,
    OutboxMessage,
    RecoveryJob,
    WebhookDestination,
)
from webhook_receiver.outbound import catalog
from webhook_receiver.portal.access import portal_session_open
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import Capability, PortalAction

pytestmark = pytest.mark.django_db

EVERYTHING = Capability.values
ANSWER = "upstream said: token tok_live_42 expired for merchant acme"


def url(name: str, *args) -> str:
    return reverse(f"webhook_portal:{name}", args=args)


def session(*capabilities: str, tenant: str = "acme") -> Client:
    _, key = portal_session_open(tenant, list(capabilities), by="test")
    client = Client()
    client.cookies[COOKIE] = key
    return client


def actions_recorded() -> list[tuple[str, str]]:
    """The actions done (an action refused is recorded too, with its reason)."""
    done = PortalAction.objects.exclude(detail__has_key="refused")
    return list(done.order_by("id").values_list("action", "target"))


class Payout(serializers.Serializer):
    payout_id = serializers.CharField()


@pytest.fixture
def opt_in_type():
    """payout.sent: a type a merchant subscribes to by its name only."""
    catalog.webhook_event(
        "payout.sent", serializer=Payout, opt_in=True, example={"payout_id": "po_1"}
    )
    yield "payout.sent"
    catalog.undeclare("payout.sent")


def moment(at) -> str:
    """As a datetime-local input sends it."""
    return timezone.localtime(at).strftime("%Y-%m-%dT%H:%M")


@pytest.fixture
def shop() -> WebhookDestination:
    """Acme's endpoint, failing: an open breaker, failing for two days, one failed message
    with an answer, and a delivered one."""
    now = timezone.now()
    dest = destination(
        "acme-shop",
        tenant="acme",
        event_types=["order.*"],
        description="Production order sync",
        consecutive_failures=10,
        paused_until=now + timedelta(seconds=50),
        failing_since=now - timedelta(days=2),
        last_failure_at=now,
    )
    lost = failed(dest, "k-failed", last_attempt_at=now)
    OutboxMessage.objects.filter(pk=lost.pk).update(last_status_code=500, last_error=ANSWER)
    DeliveryAttempt.objects.filter(message=lost).update(status_code=500, response_excerpt=ANSWER)
    message(dest, "k-delivered", status=MessageStatus.DELIVERED, delivered_at=now)
    return dest


@pytest.fixture
def job(shop) -> RecoveryJob:
    """A running recovery job of acme's endpoint, started by a session."""
    client = session(Capability.RECOVER)
    since = timezone.now() - timedelta(hours=1)
    answer = client.post(
        url("endpoint_recover", shop.pk), {"kind": "recover", "since": moment(since), "start": "1"}
    )
    assert answer.status_code == 302, answer.content[:2000]
    return RecoveryJob.objects.get()


# --- who sees which page ---------------------------------------------------------------

# route, its arguments (from the fixtures), the capability it needs (None: any session;
# the secret's page: either of two)
PAGES = [
    ("endpoints", lambda s, m, j: (), None),
    ("endpoint", lambda s, m, j: (s.pk,), None),
    ("endpoint_add", lambda s, m, j: (), Capability.MANAGE_ENDPOINTS),
    ("endpoint_edit", lambda s, m, j: (s.pk,), Capability.MANAGE_ENDPOINTS),
    (
        "endpoint_secret",
        lambda s, m, j: (s.pk,),
        (Capability.VIEW_SECRET, Capability.MANAGE_SECRET),
    ),
    ("endpoint_test", lambda s, m, j: (s.pk,), Capability.RECOVER),
    ("endpoint_recover", lambda s, m, j: (s.pk,), Capability.RECOVER),
    ("messages", lambda s, m, j: (), None),
    ("message", lambda s, m, j: (m.pk,), None),
    ("recovery_jobs", lambda s, m, j: (), None),
    ("recovery_job", lambda s, m, j: (j.pk,), None),
    ("catalog", lambda s, m, j: (), None),
]


@pytest.mark.parametrize("name, args, capability", PAGES, ids=[p[0] for p in PAGES])
def test_each_page_opens_for_its_capability_and_is_refused_without(
    shop, job, name, args, capability
):
    path = url(name, *args(shop, OutboxMessage.objects.get(key="k-failed"), job))

    needed = (
        [] if capability is None else [capability] if isinstance(capability, str) else capability
    )
    allowed = session(*needed[:1])
    others = session(*[c for c in EVERYTHING if c not in needed])
    answer = allowed.get(path)

    assert answer.status_code == 200, answer.content[:500]
    assert answer["Content-Security-Policy"] == "frame-ancestors 'none'"
    assert "no-store" in answer["Cache-Control"] and answer["Referrer-Policy"] == "same-origin"
    if capability:
        refused = others.get(path)
        assert (
            refused.status_code == 403 and "frame-ancestors" in refused["Content-Security-Policy"]
        )
    assert Client().get(path).status_code == 403  # no session at all


def test_the_secret_page_opens_for_either_secret_capability_and_neither_is_refused(shop):
    path = url("endpoint_secret", shop.pk)

    viewer = session(Capability.VIEW_SECRET).get(path).content.decode()
    rotator = session(Capability.MANAGE_SECRET).get(path).content.decode()

    assert "2 secrets sign each request now" in viewer and "Rotate the secret" not in viewer
    assert "Signing now" not in rotator and 'name="overlap"' in rotator
    refused = session(Capability.MANAGE_ENDPOINTS, Capability.RECOVER).get(path)
    assert refused.status_code == 403
    assert "see the public signing keys" in refused.content.decode()


def post_forms(page: str) -> list[str]:
    return re.findall(r'<form[^>]*method="post"[^>]*action="([^"]*)"', page)


def test_a_read_only_session_sees_no_action_at_all(shop, job):
    reader = session()
    lost = OutboxMessage.objects.get(key="k-failed")

    pages = {
        name: reader.get(path).content.decode()
        for name, path in [
            ("endpoints", url("endpoints")),
            ("endpoint", url("endpoint", shop.pk)),
            ("messages", url("messages")),
            ("message", url("message", lost.pk)),
            ("job", url("recovery_job", job.pk)),
        ]
    }

    for name, page in pages.items():
        assert post_forms(page) == [url("sign_out")], name
        # the sign-out button, and the message log's filter (a GET form): nothing else
        outside_filter = re.sub(r'<form method="get".*?</form>', "", page, flags=re.DOTALL)
        assert outside_filter.count("<button") == 1, name
        for action in ("endpoint_add", "endpoint_edit", "endpoint_test", "endpoint_recover"):
            args = () if action == "endpoint_add" else (shop.pk,)
            assert url(action, *args) not in page, (name, action)
        assert url("endpoint_secret", shop.pk) not in page
        assert 'type="checkbox"' not in page


def test_a_session_with_every_capability_sees_every_action(shop, job):
    client = session(*EVERYTHING)

    page = client.get(url("endpoint", shop.pk)).content.decode()
    log = client.get(url("messages")).content.decode()
    story = client.get(url("recovery_job", job.pk)).content.decode()

    assert url("endpoint_disable", shop.pk) in post_forms(page)
    for action in ("endpoint_edit", "endpoint_secret", "endpoint_test", "endpoint_recover"):
        assert url(action, shop.pk) in page
    assert url("endpoint_add") in client.get(url("endpoints")).content.decode()
    assert post_forms(log)[-1] == url("messages_retry") and 'form="retry-form"' in log
    assert url("recovery_cancel", job.pk) in post_forms(story)
    # every form that posts carries its CSRF token
    for text in (page, log, story):
        assert text.count('method="post"') == text.count('name="csrfmiddlewaretoken"')


ACTIONS = [
    ("endpoint_disable", lambda s: {}),
    ("endpoint_enable", lambda s: {}),
    ("endpoint_edit", lambda s: {"url": "http://127.0.0.1:9/other", "event_types": ["order.paid"]}),
    ("endpoint_secret", lambda s: {"overlap": "0"}),
    ("endpoint_test", lambda s: {"event_type": "order.paid"}),
    (
        "endpoint_recover",
        lambda s: {"kind": "recover", "since": moment(timezone.now()), "start": "1"},
    ),
]


@pytest.mark.parametrize("name, data", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_a_read_only_session_that_posts_anyway_is_refused_and_changes_nothing(shop, name, data):
    before = list(WebhookDestination.objects.values_list("url", "enabled", "secrets"))
    messages = OutboxMessage.objects.count()

    answer = session().post(url(name, shop.pk), data(shop))

    assert answer.status_code == 403
    assert list(WebhookDestination.objects.values_list("url", "enabled", "secrets")) == before
    assert OutboxMessage.objects.count() == messages and not RecoveryJob.objects.exists()
    assert actions_recorded() == []


def test_read_only_posts_to_the_add_retry_and_cancel_urls_are_refused(shop, job):
    reader = session()
    lost = OutboxMessage.objects.get(key="k-failed")

    assert reader.post(url("endpoint_add"), {"url": "http://127.0.0.1:9/x"}).status_code == 403
    assert reader.post(url("messages_retry"), {"ids": [lost.pk]}).status_code == 403
    assert reader.post(url("recovery_cancel", job.pk)).status_code == 403
    assert WebhookDestination.objects.count() == 1
    lost.refresh_from_db()
    job.refresh_from_db()
    assert lost.status == MessageStatus.FAILED and job.state == "running"


def test_a_page_that_acts_takes_post_only(shop):
    client = session(*EVERYTHING)

    assert client.get(url("endpoint_disable", shop.pk)).status_code == 405
    assert client.get(url("messages_retry")).status_code == 405
    shop.refresh_from_db()
    assert shop.enabled


def test_a_form_posted_without_its_csrf_token_is_refused(shop):
    _, key = portal_session_open("acme", EVERYTHING, by="test")
    browser = Client(enforce_csrf_checks=True)
    browser.cookies[COOKIE] = key

    assert browser.post(url("endpoint_disable", shop.pk)).status_code == 403
    shop.refresh_from_db()
    assert shop.enabled


# --- answers -----------------------------------------------------------------------------


def test_an_answers_text_is_shown_only_to_who_may_manage_endpoints(shop):
    lost = OutboxMessage.objects.get(key="k-failed")
    size = len(ANSWER.encode())

    for capabilities in ([], [Capability.RECOVER, Capability.VIEW_SECRET]):
        client = session(*capabilities)
        log = client.get(url("messages")).content.decode()
        story = client.get(url("message", lost.pk)).content.decode()
        for page in (log, story):
            assert "tok_live_42" not in page
            assert f"HTTP 500 ({size} bytes, hidden)" in page or f"{size} bytes, hidden" in page
        assert story.count(f"{size} bytes, hidden") == 2  # the last answer, the attempt

    manager = session(Capability.MANAGE_ENDPOINTS)
    assert "tok_live_42" in manager.get(url("messages")).content.decode()
    story = manager.get(url("message", lost.pk)).content.decode()
    assert story.count("tok_live_42") == 2 and "bytes, hidden" not in story


# --- endpoints -----------------------------------------------------------------------------


def test_the_endpoint_page_tells_its_health_and_when_it_would_retire(shop):
    page = session().get(url("endpoint", shop.pk)).content.decode()
    listed = session().get(url("endpoints")).content.decode()

    assert "Production order sync" in page and "http://127.0.0.1:9/hooks" in page
    assert "after 10 consecutive failures; then one probe decides" in page
    assert "retired in 2 d 23 h unless a delivery succeeds" in page
    assert re.search(r"1 message\s*</a>", page)  # failed
    assert "<code>order.*</code>" in page and "None: every event it subscribes to" in page
    assert "10 per 1 s (10 a second), bursts of 10" in page
    assert ">open</span>" in listed and "Production order sync" in listed
    assert "failing: retired in 2 d 23 h" in listed


def test_adding_an_endpoint_shows_its_secret_once_and_never_again(opt_in_type):
    client = session(Capability.MANAGE_ENDPOINTS)
    form = client.get(url("endpoint_add")).content.decode()
    assert 'value="order.*"' in form and 'value="order.paid"' in form
    assert "outbox.*" not in form  # a group of opt-in types has no pattern
    assert "opt-in: by its name only" in form and "outbox.message_failed" not in form

    answer = client.post(
        url("endpoint_add"),
        {
            "url": "http://127.0.0.1:9/in",
            "description": "Staging",
            "event_types": ["order.*", "payout.sent"],
            "filter": '{"data.status": "paid"}',
        },
    )

    made = WebhookDestination.objects.get()
    secret = made.secrets[0]
    page = answer.content.decode()
    assert answer.status_code == 200 and "Location" not in answer
    assert page.count(secret) == 1 and "it is never shown again" in page
    assert made.tenant == "acme" and made.name.startswith("acme-") and made.description == "Staging"
    assert made.event_types == ["order.*", "payout.sent"]
    assert made.filter == {"data.status": "paid"}
    for later in (url("endpoint", made.pk), url("endpoints"), url("endpoint_edit", made.pk)):
        assert secret not in client.get(later).content.decode()
    assert actions_recorded() == [("endpoint.add", f"endpoint {made.pk}")]


def test_an_internal_address_is_refused_with_the_egress_guards_reason():
    client = session(Capability.MANAGE_ENDPOINTS)

    answer = client.post(
        url("endpoint_add"), {"url": "http://169.254.169.254/latest/meta-data", "filter": "{"}
    )

    page = answer.content.decode()
    assert answer.status_code == 400
    assert "This is not JSON" in page
    assert 'aria-describedby="id_filter_helptext id_filter_error"' in page
    # the service's check runs once the form's own pass: a valid filter, then the URL
    answer = client.post(url("endpoint_add"), {"url": "http://169.254.169.254/latest/meta-data"})
    page = answer.content.decode()
    assert answer.status_code == 400 and "refused by the egress guard" in page
    assert 'id="id_url_error"' in page and 'aria-invalid="true"' in page
    assert not WebhookDestination.objects.exists() and actions_recorded() == []


def test_editing_an_endpoint_changes_what_it_is_sent(shop):
    client = session(Capability.MANAGE_ENDPOINTS)
    form = client.get(url("endpoint_edit", shop.pk)).content.decode()
    assert re.search(r'value="order\.\*" id="[^"]+" checked', form)

    answer = client.post(
        url("endpoint_edit", shop.pk),
        {
            "url": "http://127.0.0.1:9/v2",
            "description": "v2",
            "event_types": ["order.paid"],
            "filter": "",
        },
    )

    assert answer.status_code == 302
    assert answer["Location"] == url("endpoint", shop.pk) + "?note=saved"
    shop.refresh_from_db()
    assert (shop.url, shop.event_types, shop.filter) == (
        "http://127.0.0.1:9/v2",
        ["order.paid"],
        None,
    )
    assert "Saved." in client.get(answer["Location"]).content.decode()
    assert actions_recorded() == [("endpoint.change", f"endpoint {shop.pk}")]


def test_disabling_and_enabling_an_endpoint(shop):
    client = session(Capability.MANAGE_ENDPOINTS)

    disabled = client.post(url("endpoint_disable", shop.pk))
    shop.refresh_from_db()
    assert not shop.enabled and disabled["Location"].endswith("?note=disabled")
    page = client.get(disabled["Location"]).content.decode()
    assert "Disabled: nothing more is sent" in page and url("endpoint_enable", shop.pk) in page

    client.post(url("endpoint_enable", shop.pk))
    shop.refresh_from_db()
    assert shop.enabled and shop.paused_until is None
    assert actions_recorded() == [
        ("endpoint.disable", f"endpoint {shop.pk}"),
        ("endpoint.enable", f"endpoint {shop.pk}"),
    ]


def test_a_rotation_keeps_the_old_secrets_signing_until_the_overlap_ends(shop):
    client = session(Capability.MANAGE_SECRET)

    answer = client.post(url("endpoint_secret", shop.pk), {"overlap": "3600"})

    shop.refresh_from_db()
    new = shop.secrets[0]
    page = answer.content.decode()
    assert answer.status_code == 200 and page.count(new) == 1
    assert "keeps signing beside the new one until" in page
    now = timezone.now().timestamp()
    assert shop.signing_with(now) == [new, SECRET, OLD_SECRET]
    assert shop.signing_with(now + 3601) == [new]
    assert new not in client.get(url("endpoint_secret", shop.pk)).content.decode()
    assert actions_recorded() == [("secret.rotate", f"endpoint {shop.pk}")]


def test_a_session_that_may_only_view_the_secret_may_not_rotate_it(shop):
    answer = session(Capability.VIEW_SECRET).post(url("endpoint_secret", shop.pk), {"overlap": "0"})

    assert answer.status_code == 403
    shop.refresh_from_db()
    assert shop.secrets == [SECRET, OLD_SECRET] and actions_recorded() == []


def test_a_test_event_makes_one_message_for_that_endpoint_only(shop):
    other = destination("acme-other", tenant="acme", event_types=["order.*"])
    client = session(Capability.RECOVER)
    before = set(OutboxMessage.objects.values_list("id", flat=True))

    answer = client.post(url("endpoint_test", shop.pk), {"event_type": "order.paid"})

    made = OutboxMessage.objects.exclude(id__in=before)
    assert made.count() == 1
    sent = made.get()
    assert sent.destination_id == shop.pk and sent.key.startswith("test:")
    assert sent.payload["type"] == "order.paid" and sent.payload["data"]["order_id"] == "ord-1042"
    assert not OutboxMessage.objects.filter(destination=other).exists()
    assert url("message", sent.pk) in answer.content.decode()
    assert actions_recorded() == [("endpoint.test", f"endpoint {shop.pk}")]
    story = client.get(url("message", sent.pk)).content.decode()
    assert "test event" in story and "&quot;ord-1042&quot;" in story


def test_a_test_event_of_a_type_without_an_example_is_a_form_error(shop):
    answer = session(Capability.RECOVER).post(url("endpoint_test", shop.pk), {"event_type": "x.y"})

    assert answer.status_code == 400 and 'id="id_event_type_error"' in answer.content.decode()
    assert actions_recorded() == []


# --- the message log -------------------------------------------------------------------------


def listed_keys(page: str) -> list[str]:
    page = page.replace("<wbr>", "")
    return re.findall(
        r'<th scope="row" class="key"[^>]*><a href="[^"]+"><code>([^<]+)</code>', page
    )


def test_the_message_log_filters_by_endpoint_type_state_and_time(shop):
    other = destination("acme-other", tenant="acme")
    old = timezone.now() - timedelta(days=3)
    message(other, "o-cancelled", event_type="order.cancelled", created_at=old)
    message(other, "o-paid", event_type="order.paid")
    message(destination("bolt-shop", tenant="bolt"), "b-secret")
    client = session()

    def keys(**query) -> list[str]:
        answer = client.get(url("messages"), query)
        assert answer.status_code == 200, answer.content[:1500]
        return listed_keys(answer.content.decode())

    assert keys() == ["o-paid", "o-cancelled", "k-delivered", "k-failed"]
    assert keys(endpoint=other.pk) == ["o-paid", "o-cancelled"]
    assert keys(event_type="order.cancelled") == ["o-cancelled"]
    assert keys(status="failed") == ["k-failed"]
    assert keys(until=moment(timezone.now() - timedelta(days=1))) == ["o-cancelled"]
    assert keys(since=moment(timezone.now() - timedelta(days=1)), endpoint=other.pk) == ["o-paid"]
    wrong = client.get(url("messages"), {"status": "lost"})
    assert wrong.status_code == 400 and 'id="id_status_error"' in wrong.content.decode()


def test_the_message_log_goes_fifty_a_page(shop):
    for n in range(55):
        message(shop, f"bulk-{n:02d}")
    client = session()

    first = client.get(url("messages"), {"endpoint": shop.pk}).content.decode()
    second = client.get(url("messages"), {"endpoint": shop.pk, "page": 2}).content.decode()

    assert len(listed_keys(first)) == 50 and len(listed_keys(second)) == 7
    assert "57 messages" in first and "Page 1 of 2" in first
    assert f"?endpoint={shop.pk}&amp;page=2" in first


def test_retry_now_takes_the_ticked_messages_and_goes_back_with_a_count(shop):
    also = failed(shop, "k-failed-2", last_attempt_at=timezone.now())
    lost = OutboxMessage.objects.get(key="k-failed")
    delivered = OutboxMessage.objects.get(key="k-delivered")
    client = session(Capability.RECOVER)
    back = url("messages") + "?status=failed&page=1"

    answer = client.post(
        url("messages_retry"), {"ids": [lost.pk, also.pk, delivered.pk], "next": back}
    )

    assert answer.status_code == 302
    assert answer["Location"] == url("messages") + "?status=failed&retried=2&asked=3"
    assert set(OutboxMessage.objects.filter(status="pending").values_list("key", flat=True)) == {
        "k-failed",
        "k-failed-2",
    }
    page = client.get(answer["Location"]).content.decode()
    assert "2 messages of 3 are due now" in page and "were left as they are" in page
    assert actions_recorded() == [("messages.retry", "3 message(s)")]


def test_retry_now_never_sends_the_browser_out_of_the_portal(shop):
    lost = OutboxMessage.objects.get(key="k-failed")

    answer = session(Capability.RECOVER).post(
        url("messages_retry"), {"ids": [lost.pk], "next": "https://evil.example/phish"}
    )

    assert answer["Location"] == url("messages") + "?retried=1&asked=1"


def test_the_story_of_a_message_shows_its_payload_and_attempts_newest_first(shop):
    lost = OutboxMessage.objects.get(key="k-failed")
    now = timezone.now()
    DeliveryAttempt.objects.create(
        message=lost, number=2, started_at=now, duration_ms=3000, error="ReadTimeout: 3 s"
    )
    client = session(Capability.MANAGE_ENDPOINTS, Capability.RECOVER)

    page = client.get(url("message", lost.pk)).content.decode()

    numbers = re.findall(r'<th scope="row" class="num" data-label="#">(\d+)</th>', page)
    assert numbers == ["2", "1"]
    assert "ReadTimeout: 3 s" in page and "3000 ms" in page and "&quot;k-failed&quot;" in page
    assert url("messages_retry") in post_forms(page)


# --- recovery -------------------------------------------------------------------------------


def test_a_plan_writes_nothing_then_start_starts_the_job_and_cancel_stops_it(shop):
    client = session(Capability.RECOVER)
    since = moment(timezone.now() - timedelta(hours=1))
    form = client.get(url("endpoint_recover", shop.pk)).content.decode()
    assert 'name="since"' in form and 'name="start"' not in form

    planned = client.post(
        url("endpoint_recover", shop.pk), {"kind": "recover", "since": since, "plan": "1"}
    )

    page = planned.content.decode()
    assert planned.status_code == 200 and "The plan: 1 message" in page
    assert "<code>k-failed</code>" in page and "Start: send 1 message" in page
    assert not RecoveryJob.objects.exists()
    assert actions_recorded() == [("recovery.plan", f"endpoint {shop.pk}")]  # rate-limited too

    started = client.post(
        url("endpoint_recover", shop.pk), {"kind": "recover", "since": since, "start": "1"}
    )

    made = RecoveryJob.objects.get()
    assert started["Location"] == url("recovery_job", made.pk) + "?note=started"
    assert made.planned == 1 and made.created_by.startswith("portal session ")
    page = client.get(started["Location"]).content.decode()
    assert "Started: the relay sends" in page and url("recovery_cancel", made.pk) in page
    listed = client.get(url("recovery_jobs"), {"endpoint": shop.pk}).content.decode()
    assert f"#{made.pk}" in listed and "0 of 1 released" in listed

    cancelled = client.post(url("recovery_cancel", made.pk))

    made.refresh_from_db()
    assert made.state == "cancelled" and cancelled["Location"].endswith("?note=cancelled")
    assert "Cancel the job" not in client.get(cancelled["Location"]).content.decode()
    assert actions_recorded() == [
        ("recovery.plan", f"endpoint {shop.pk}"),
        ("recovery.start", f"endpoint {shop.pk}"),
        ("recovery.cancel", f"recovery job {made.pk}"),
    ]


def test_a_plan_the_service_refuses_is_shown_on_the_form(shop):
    client = session(Capability.RECOVER)
    too_old = moment(timezone.now() - timedelta(days=60))

    answer = client.post(
        url("endpoint_recover", shop.pk), {"kind": "recover", "since": too_old, "plan": "1"}
    )

    assert answer.status_code == 400 and "replay horizon of 30 days" in answer.content.decode()
    fast = client.post(
        url("endpoint_recover", shop.pk),
        {"kind": "recover", "since": moment(timezone.now()), "rate": "50", "plan": "1"},
    )
    assert fast.status_code == 400 and "below acme-shop&#x27;s own, 10/s" in fast.content.decode()


# --- the catalog and the markup ------------------------------------------------------------


def test_the_catalog_shows_every_type_with_its_marks_example_and_schema(opt_in_type):
    page = session().get(url("catalog")).content.decode()

    assert '<h2 id="group-order"><code>order</code></h2>' in page
    assert "An order was paid: it may be fulfilled." in page
    assert "&quot;order_id&quot;: &quot;ord-1042&quot;" in page  # the example
    assert "&quot;maxLength&quot;: 100" in page  # the schema, its data's reference in place
    assert "#/components/schemas/OrderChanged" not in page
    assert page.count("opt-in: by its name only") == 1  # payout.sent
    assert "outbox." not in page and "silence." not in page  # the app's notices: ops' only


class Markup(HTMLParser):
    """What an accessibility check reads of a page: its headings' levels, its form
    controls and the labels that name them."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[int] = []
        self.controls: list[str] = []
        self.labelled: set[str] = set()
        self.tables_without_scope = 0

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if re.fullmatch(r"h[1-6]", tag):
            self.headings.append(int(tag[1]))
        if tag == "label" and found.get("for"):
            self.labelled.add(found["for"])
        if tag in ("select", "textarea") or (
            tag == "input" and found.get("type") not in ("hidden", "submit")
        ):
            self.controls.append(found.get("id") or f"<{tag} name={found.get('name')}>")
        if tag == "th" and "scope" not in found:
            self.tables_without_scope += 1


@pytest.mark.parametrize(
    "name",
    ["endpoints", "endpoint", "endpoint_add", "endpoint_edit", "endpoint_secret", "endpoint_test",
     "endpoint_recover", "messages", "message", "recovery_jobs", "recovery_job", "catalog"],
)  # fmt: skip
def test_every_page_names_its_controls_and_orders_its_headings(shop, job, name):
    args = {
        "endpoint": (shop.pk,),
        "endpoint_edit": (shop.pk,),
        "endpoint_secret": (shop.pk,),
        "endpoint_test": (shop.pk,),
        "endpoint_recover": (shop.pk,),
        "message": (OutboxMessage.objects.get(key="k-failed").pk,),
        "recovery_job": (job.pk,),
    }.get(name, ())
    page = session(*EVERYTHING).get(url(name, *args)).content.decode()

    markup = Markup()
    markup.feed(page)

    assert [c for c in markup.controls if c not in markup.labelled] == [], name
    assert markup.headings[0] == 1 and markup.headings.count(1) == 1
    levels = markup.headings
    assert all(b - a <= 1 for a, b in zip(levels, levels[1:], strict=False)), levels
    assert markup.tables_without_scope == 0
    assert 'href="#content"' in page and '<main id="content"' in page
    assert len(re.findall(r'<a [^>]*aria-current="page"', page)) == 1
