"""The portal's way in (portal/access.py, guard.py, pages/entry.py, the command): a link
opens one session once, before it expires; only hashes are stored; sessions end when
revoked; actions are audited and rate-limited per session."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import close_old_connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from webhook_receiver.portal.access import (
    Portal,
    PortalRefused,
    TooManyActions,
    portal_action,
    portal_exchange,
    portal_link,
    portal_of,
    portal_revoke,
    portal_session_open,
    token_hash,
)
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import PortalAction, PortalLink, PortalSession

pytestmark = pytest.mark.django_db

ENTER = reverse("webhook_portal:enter")


def with_keys(settings, **keys) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, **keys}


def token_of(url: str) -> str:
    assert url.count("#") == 1
    return url.split("#", 1)[1]


def test_a_link_carries_its_token_in_the_fragment_and_only_its_hash_is_stored():
    link = portal_link("acme", ["recover"], by="ops")

    token = token_of(link.url)
    assert link.url.startswith(ENTER + "#") and len(token) >= 40
    stored = PortalLink.objects.get()
    assert stored.token_hash == token_hash(token) and token not in str(stored.__dict__)
    assert stored.capabilities == ["recover"] and stored.created_by == "ops"
    assert timedelta(minutes=59) < stored.expires_at - timezone.now() <= timedelta(hours=1)


def test_a_link_starts_with_the_portals_address(settings):
    with_keys(settings, PORTAL_URL="https://shop.example/webhooks-portal/")
    link = portal_link("acme")
    assert link.url.startswith("https://shop.example/webhooks-portal/#")
    assert portal_link("acme", base_url="https://x.example/p/").url.startswith(
        "https://x.example/p/#"
    )


@pytest.mark.parametrize(
    "tenant, capabilities, expires_in, why",
    [
        ("", [], timedelta(hours=1), "a tenant is named by a non-empty key"),
        ("acme", ["delete_everything"], timedelta(hours=1), "unknown capability delete_everything"),
        ("acme", [], timedelta(days=7, seconds=1), "at most 7 days"),
        ("acme", [], timedelta(0), "at most 7 days"),
    ],
)
def test_a_link_is_refused_for_no_tenant_an_unknown_capability_or_a_lifetime_out_of_range(
    tenant, capabilities, expires_in, why
):
    with pytest.raises(ValueError, match=why):
        portal_link(tenant, capabilities, expires_in)
    assert not PortalLink.objects.exists()


def test_a_token_opens_one_session_once():
    token = token_of(portal_link("acme", ["view_secret"]).url)

    session, key = portal_exchange(token)

    assert (session.tenant, session.capabilities) == ("acme", ["view_secret"])
    assert session.key_hash == token_hash(key) and portal_of(key).session == session
    with pytest.raises(PortalRefused, match="used or has expired"):
        portal_exchange(token)
    assert PortalSession.objects.count() == 1


@pytest.mark.postgres_only("two connections race for one link")
@pytest.mark.django_db(transaction=True)
def test_two_requests_racing_with_one_token_open_one_session():
    token = token_of(portal_link("acme").url)
    start, outcomes = threading.Barrier(4), []

    def exchange():
        start.wait()
        try:
            outcomes.append(portal_exchange(token)[0].pk)
        except PortalRefused:
            outcomes.append("refused")
        finally:
            close_old_connections()

    threads = [threading.Thread(target=exchange) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert sorted(map(str, outcomes)).count("refused") == 3
    assert PortalSession.objects.count() == 1


def test_an_expired_or_unknown_token_is_refused_alike():
    link = portal_link("acme")
    PortalLink.objects.filter(pk=link.record.pk).update(expires_at=timezone.now())
    for token in (token_of(link.url), "not-a-token"):
        with pytest.raises(PortalRefused, match="^this link has been used or has expired"):
            portal_exchange(token)


def test_the_entry_page_posts_the_fragment_and_the_exchange_sets_a_cookie_for_the_portal():
    client = Client(enforce_csrf_checks=True)
    token = token_of(portal_link("acme").url)

    page = client.get(ENTER)
    assert page.status_code == 200 and b"location.hash" in page.content
    assert page["Content-Security-Policy"] == "frame-ancestors 'none'"
    assert page["Referrer-Policy"] == "same-origin" and "no-store" in page["Cache-Control"]

    refused = client.post(reverse("webhook_portal:exchange"), {"token": token})
    assert refused.status_code == 403  # no CSRF token: nothing used
    assert PortalLink.objects.get().used_at is None

    csrf = page.context["csrf_token"]
    opened = client.post(
        reverse("webhook_portal:exchange"), {"token": token, "csrfmiddlewaretoken": str(csrf)}
    )

    assert opened.status_code == 302 and opened["Location"] == reverse("webhook_portal:endpoints")
    cookie = opened.cookies[COOKIE]
    assert cookie["httponly"] and cookie["path"] == ENTER and cookie["samesite"] == "Lax"
    assert portal_of(cookie.value).tenant == "acme"
    assert client.get(ENTER)["Location"] == reverse("webhook_portal:endpoints")


def test_a_used_link_in_the_browser_says_so():
    client = Client()
    token = token_of(portal_link("acme").url)
    client.post(reverse("webhook_portal:exchange"), {"token": token})

    again = Client().post(reverse("webhook_portal:exchange"), {"token": token})

    assert again.status_code == 403
    assert b"this link has been used or has expired: ask for a new one" in again.content


def test_revoking_ends_one_session_or_every_session_of_a_tenant():
    (s1, k1), (s2, k2) = (portal_session_open("acme", by="t") for _ in range(2))
    _, k3 = portal_session_open("bolt", by="t")

    assert portal_revoke([s1.pk], by="ops") == 1
    assert portal_of(k1) is None and portal_of(k2) is not None
    assert portal_revoke([s2.pk], tenant="bolt", by="ops") == 0  # not bolt's
    assert portal_revoke(tenant="acme", by="ops") == 1
    assert portal_of(k2) is None and portal_of(k3) is not None
    assert PortalSession.objects.get(pk=s2.pk).revoked_by == "ops"
    assert portal_revoke(by="ops") == 0  # neither ids nor a tenant: nothing


def test_an_expired_session_opens_nothing_and_the_page_says_so():
    session, key = portal_session_open("acme", by="t")
    PortalSession.objects.filter(pk=session.pk).update(expires_at=timezone.now())
    client = Client()
    client.cookies[COOKIE] = key

    page = client.get(reverse("webhook_portal:endpoints"))

    assert portal_of(key) is None and page.status_code == 403
    assert b"Your portal session has ended" in page.content


def test_the_portal_alone_may_be_framed_by_the_origins_listed(settings):
    with_keys(settings, PORTAL_FRAME_ANCESTORS=["https://admin.shop.example"])
    portal_page = Client().get(ENTER)
    elsewhere = Client().get(reverse("admin:login"))

    assert portal_page["Content-Security-Policy"] == (
        "frame-ancestors 'self' https://admin.shop.example"
    )
    assert "X-Frame-Options" not in portal_page
    assert elsewhere["X-Frame-Options"] == "DENY"
    assert "frame-ancestors" not in elsewhere.get("Content-Security-Policy", "")


@pytest.mark.parametrize("origins", [["https://a.example/path"], ["ftp://a.example"], "https://a"])
def test_a_frame_ancestor_is_an_origin(settings, origins):
    from django.core.exceptions import ImproperlyConfigured

    from webhook_receiver.conf import app_settings

    with_keys(settings, PORTAL_FRAME_ANCESTORS=origins)
    with pytest.raises(ImproperlyConfigured, match="PORTAL_FRAME_ANCESTORS"):
        app_settings()


def test_a_session_takes_so_many_actions_a_minute_each_one_audited(settings):
    with_keys(settings, PORTAL_ACTIONS_PER_MINUTE=3)
    portal = Portal(portal_session_open("acme", by="t")[0])
    other = Portal(portal_session_open("acme", by="t")[0])
    for n in range(3):
        portal_action(portal, "endpoint.test", f"endpoint {n}")

    with pytest.raises(TooManyActions) as refused:
        portal_action(portal, "endpoint.test", "endpoint 9")

    assert 1 <= refused.value.retry_after <= 61
    portal_action(other, "endpoint.test", "endpoint 1")  # its own count
    PortalAction.objects.update(at=timezone.now() - timedelta(seconds=61))
    portal_action(portal, "endpoint.test", "endpoint 9")  # the minute has passed
    actions = PortalAction.objects.filter(session=portal.session).order_by("id")
    assert [a.target for a in actions] == ["endpoint 0", "endpoint 1", "endpoint 2", "endpoint 9"]
    assert {a.tenant for a in actions} == {"acme"}


@pytest.mark.postgres_only("concurrent actions of one session count one by one")
@pytest.mark.django_db(transaction=True)
def test_concurrent_actions_of_one_session_never_pass_its_limit(settings):
    with_keys(settings, PORTAL_ACTIONS_PER_MINUTE=5)
    from django.db import transaction

    portal = Portal(portal_session_open("acme", by="t")[0])
    start, outcomes = threading.Barrier(8), []

    def act(n):
        start.wait()
        try:
            with transaction.atomic():
                portal_action(portal, "endpoint.test", f"endpoint {n}")
            outcomes.append("done")
        except TooManyActions:
            outcomes.append("refused")
        finally:
            close_old_connections()

    threads = [threading.Thread(target=act, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert sorted(outcomes) == ["done"] * 5 + ["refused"] * 3
    assert PortalAction.objects.count() == 5


def test_the_command_prints_a_link_and_revokes(capsys):
    call_command("webhook_portal_link", "acme", "--capability", "recover", "--expires-in", "2h")
    out, err = capsys.readouterr()

    token = token_of(out.strip())
    assert "portal link for acme (recover), usable once until" in err and token not in err
    link = PortalLink.objects.get()
    assert timedelta(minutes=119) < link.expires_at - timezone.now() <= timedelta(hours=2)
    portal_exchange(token)

    call_command("webhook_portal_link", "acme", "--revoke")
    assert "1 open session(s) of acme ended" in capsys.readouterr().out
    assert not PortalSession.objects.filter(revoked_at__isnull=True).exists()


@pytest.mark.parametrize(
    "args, why",
    [
        (["acme", "--expires-in", "forever"], "is not a span"),
        (["acme", "--expires-in", "8d"], "at most 7 days"),
        (["acme", "--expires-in", "9" * 400 + "d"], "is not a span"),
        ([], "name the tenant"),
    ],
)
def test_the_command_says_what_is_wrong(args, why):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=why):
        call_command("webhook_portal_link", *args)
    assert not PortalLink.objects.exists()


def test_the_portals_records_go_with_the_other_audit_records():
    from webhook_receiver.tasks import purge_audit_records_task

    old, _ = portal_session_open("acme", by="t")
    portal_action(Portal(old), "endpoint.test", "endpoint 1")
    kept, _ = portal_session_open("acme", by="t")
    portal_action(Portal(kept), "endpoint.test", "endpoint 2")
    portal_link("acme")
    long_ago = timezone.now() - timedelta(days=31)
    PortalSession.objects.filter(pk=old.pk).update(expires_at=long_ago)
    PortalAction.objects.filter(session=old).update(at=long_ago)
    PortalLink.objects.update(expires_at=long_ago)

    assert purge_audit_records_task() == 3

    assert list(PortalSession.objects.all()) == [kept]
    assert [a.target for a in PortalAction.objects.all()] == ["endpoint 2"]
    assert not PortalLink.objects.exists()
