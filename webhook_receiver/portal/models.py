"""The portal's tables: the one-use links a host makes for a tenant, the sessions they
open, and the audit of what each session did.

A link's token and a session's key are random (``secrets.token_urlsafe``); only their
SHA-256 is stored, so a copy of the database opens nothing. Imported by
``webhook_receiver.models``; they belong to the ``webhook_receiver`` app.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Capability(models.TextChoices):
    """What a portal session may do besides reading its tenant's endpoints, messages,
    recovery jobs and the catalog (every session may)."""

    VIEW_SECRET = "view_secret", _("see the public signing keys, and how many secrets sign")
    MANAGE_SECRET = "manage_secret", _("rotate a signing secret")
    MANAGE_ENDPOINTS = (
        "manage_endpoints",
        _("add, change, disable and enable endpoints, and read their answers"),
    )
    RECOVER = "recover", _("send test events, start and cancel recovery jobs")


class PortalLink(models.Model):
    """A link a host made for a tenant: used once, before ``expires_at``."""

    token_hash = models.CharField(max_length=64, unique=True)
    tenant = models.CharField(max_length=100, db_index=True)
    capabilities = models.JSONField(default=list)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("portal link")
        verbose_name_plural = _("portal links")
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"link {self.pk} for {self.tenant}"


class PortalSession(models.Model):
    """A tenant's session in the portal, opened by a link or by the host's own page; it
    ends at ``expires_at`` or when revoked."""

    key_hash = models.CharField(max_length=64, unique=True)
    tenant = models.CharField(max_length=100, db_index=True)
    capabilities = models.JSONField(default=list)
    link = models.ForeignKey(PortalLink, null=True, blank=True, on_delete=models.SET_NULL)
    # how it was opened: "link 12", or the host's words ("user alice")
    opened_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name = _("portal session")
        verbose_name_plural = _("portal sessions")
        ordering = ["-id"]
        permissions = [("revoke_portalsession", "Can revoke portal sessions")]

    def __str__(self) -> str:
        return f"session {self.pk} of {self.tenant}"


class PortalAction(models.Model):
    """One thing a portal session did (the audit), and the count its rate limit reads."""

    session = models.ForeignKey(PortalSession, on_delete=models.CASCADE, related_name="actions")
    tenant = models.CharField(max_length=100)
    # "endpoint.disable", "secret.rotate", "recovery.start", …
    action = models.CharField(max_length=64)
    # what it acted on: "endpoint 12", "recovery job 4"
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        verbose_name = _("portal action")
        verbose_name_plural = _("portal actions")
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["session", "at"], name="webhook_portal_action_recent"),
            models.Index(fields=["tenant", "at"], name="webhook_portal_action_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target}".strip()
