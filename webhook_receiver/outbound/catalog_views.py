"""The event catalog's OpenAPI 3.1 document over HTTP (catalog_document.py): a host mounts
it with ``path("webhooks-catalog/", include("webhook_receiver.outbound.catalog_urls"))``
and serves ``GET webhooks-catalog/openapi.json``. It says what the host sends (and, where
the host mounts the portal, how its JSON API is called), never what it holds: no
destination, no message."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from .catalog import revision
from .catalog_document import CatalogUnavailable, catalog_document, portal_api_prefix

logger = logging.getLogger(__name__)

# the document changes only when the code does: clients may keep it a while
MAX_AGE_SECONDS = 300


@require_safe
def catalog_view(request: HttpRequest) -> HttpResponse:
    try:
        body = _document_bytes(revision(), portal_api_prefix())
    except CatalogUnavailable as exc:
        logger.error("the event catalog's document cannot be made: %s", exc)
        return HttpResponse(
            "The event catalog's document cannot be made here: see the server's log.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    response = HttpResponse(body, content_type="application/json")
    response["Cache-Control"] = f"public, max-age={MAX_AGE_SECONDS}"
    return response


@functools.lru_cache(maxsize=1)
def _document_bytes(catalog_revision: int, portal_api: str | None) -> bytes:
    """The document as sent, made once per catalog revision, portal's place and process
    (making it takes tens of milliseconds: a public URL must not)."""
    document: dict[str, Any] = catalog_document()
    return json.dumps(document, ensure_ascii=False, indent=2).encode()
