"""The portal's admin: links, sessions and the audit listed without a token or a key;
Revoke behind its own permission."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support.admin import act, action_values
from webhook_receiver.portal.access import (
    Portal,
    portal_action,
    portal_exchange,
    portal_link,
    portal_of,
    portal_session_open,
)
from webhook_receiver.portal.models import PortalSession

pytestmark = pytest.mark.django_db

SESSIONS = reverse("admin:webhook_receiver_portalsession_changelist")
LINKS = reverse("admin:webhook_receiver_portallink_changelist")
ACTIONS = reverse("admin:webhook_receiver_portalaction_changelist")


def test_the_lists_show_links_sessions_and_actions_but_never_a_token_or_a_key(client, staff_user):
    token = portal_link("acme", ["recover"], by="ops").url.split("#")[1]
    session, key = portal_exchange(token)
    portal_action(Portal(session), "endpoint.test", "endpoint 3")
    client.force_login(staff_user("view_portallink", "view_portalsession", "view_portalaction"))

    pages = {url: client.get(url).content.decode() for url in (LINKS, SESSIONS, ACTIONS)}

    assert "used " in pages[LINKS] and "recover" in pages[LINKS]
    assert "open until" in pages[SESSIONS] and f"link {session.link_id}" in pages[SESSIONS]
    assert "endpoint.test" in pages[ACTIONS] and "endpoint 3" in pages[ACTIONS]
    for page in pages.values():
        assert token not in page and key not in page and session.key_hash not in page


def test_revoking_needs_its_permission_and_ends_the_sessions(client, staff_user):
    session, key = portal_session_open("acme", by="t")
    viewer = staff_user("view_portalsession", username="viewer")
    client.force_login(viewer)
    assert "revoke_selected" not in action_values(client.get(SESSIONS))

    staff_user.grant(viewer, "revoke_portalsession")
    act(client, SESSIONS, "revoke_selected", session)

    assert portal_of(key) is None
    assert PortalSession.objects.get().revoked_by == "viewer"
    assert "revoked" in client.get(SESSIONS).content.decode()
