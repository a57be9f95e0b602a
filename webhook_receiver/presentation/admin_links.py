"""Links into the host's admin, for pages, notices and mails: one way to name an admin
page of the app's models, and None where the host's admin does not route it."""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.urls import NoReverseMatch, reverse
from django.utils.http import urlencode


def admin_url(
    model: type[Model], view: str = "changelist", *args: Any, site: str = "admin", **query: Any
) -> str | None:
    """The path of ``model``'s admin ``view`` ("changelist", "change", …) with ``args``,
    and ``query`` as its query string; None when the admin (``site``, its URL namespace)
    is not installed or does not route it."""
    opts = model._meta
    try:
        path = reverse(f"{site}:{opts.app_label}_{opts.model_name}_{view}", args=args)
    except NoReverseMatch:
        return None
    return f"{path}?{urlencode(query)}" if query else path
