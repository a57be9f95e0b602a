"""The portal opened from the host's own pages (pages/entry.host_portal): behind the
host's login, a user its grant maps to a tenant gets a session of that tenant, with the
grant's capabilities; a user it maps to nothing, and a visitor not signed in, get none."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from webhook_receiver.portal.access import portal_of
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import PortalSession

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.portal.host_urls")]

ENTRY = "/account/webhooks/"


def signed_in(username: str) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(username=username, password="pw"))
    return client


def test_a_user_the_host_maps_to_a_tenant_opens_that_tenants_portal():
    client = signed_in("alice")

    opened = client.get(ENTRY)

    assert opened.status_code == 302
    assert opened["Location"] == reverse("webhook_portal:endpoints")
    portal = portal_of(opened.cookies[COOKIE].value)
    assert (portal.tenant, sorted(portal.capabilities)) == ("acme", ["recover"])
    assert PortalSession.objects.get().opened_by == "user alice"
    assert client.get(opened["Location"]).status_code == 200


def test_a_user_the_host_maps_to_nothing_has_no_portal():
    refused = signed_in("mallory").get(ENTRY)

    assert refused.status_code == 403
    assert b"There is no webhook portal for your account." in refused.content
    assert not PortalSession.objects.exists()


def test_a_visitor_not_signed_in_is_sent_to_the_hosts_login():
    answer = Client().get(ENTRY)

    assert answer.status_code == 302 and "login" in answer["Location"]
    assert not PortalSession.objects.exists()
