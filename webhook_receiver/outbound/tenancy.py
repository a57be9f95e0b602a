"""Tenants: whose a destination is, and the one layer through which the outbox's
services read and act on destinations, their messages, their attempts and their recovery jobs.

A destination belongs to a tenant (``WebhookDestination.tenant``: the host's key for a
merchant account; empty for a single-shop host, whose destinations are all its own).
Every service that reads or changes destinations, messages or attempts takes a
``scope`` (a required argument): ``tenant_scope("acme")`` reaches that tenant's
destinations and what hangs from them, and nothing else; ``EVERY_TENANT`` is the staff's
(the admin, the commands, the relay). A service given another tenant's id finds nothing:
not "forbidden", nothing, the same answer as an id that does not exist. The querysets
below are the only way in; a service never starts from a model's manager.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from .models import DeliveryAttempt, OutboxMessage, RecoveryJob, WebhookDestination


@dataclass(frozen=True)
class Scope:
    """What a service may reach: one tenant's records (``tenant``), or every tenant's
    (``None``: the staff)."""

    tenant: str | None

    def destinations(self) -> QuerySet[WebhookDestination]:
        everything = WebhookDestination.objects.all()
        return everything if self.tenant is None else everything.filter(tenant=self.tenant)

    def messages(self) -> QuerySet[OutboxMessage]:
        everything = OutboxMessage.objects.all()
        if self.tenant is None:
            return everything
        return everything.filter(destination__tenant=self.tenant)

    def attempts(self) -> QuerySet[DeliveryAttempt]:
        everything = DeliveryAttempt.objects.all()
        if self.tenant is None:
            return everything
        return everything.filter(message__destination__tenant=self.tenant)

    def recovery_jobs(self) -> QuerySet[RecoveryJob]:
        everything = RecoveryJob.objects.all()
        if self.tenant is None:
            return everything
        return everything.filter(destination__tenant=self.tenant)

    def __str__(self) -> str:
        return "every tenant" if self.tenant is None else f"tenant {self.tenant}"


# the staff's scope: the admin, the commands, the relay and its jobs
EVERY_TENANT = Scope(None)


def tenant_scope(tenant: str) -> Scope:
    """One tenant's scope. ValueError for an empty key: a single-shop host's
    destinations are reached with EVERY_TENANT, never with a tenant of no name."""
    if not isinstance(tenant, str) or not tenant.strip():
        raise ValueError("a tenant is named by a non-empty key")
    return Scope(tenant)
