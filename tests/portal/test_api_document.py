"""The one OpenAPI 3.1 document (outbound/catalog_document.py, served at
/webhooks-catalog/openapi.json) describes the portal's JSON API beside the events: every
route of the API's URLconf under the prefix where the host mounted the portal, each
operation ``portal_…``, tagged ``portal``, saying the capability it needs, behind the
``bearerAuth`` scheme; a host without the portal gets the events alone."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import include, path, resolve
from drf_spectacular.drainage import GENERATOR_STATS
from openapi_spec_validator import validate

from webhook_receiver.outbound.catalog_document import catalog_document, portal_api_prefix
from webhook_receiver.portal.api import urls as api_urls

# two host URLconfs of this module's: the portal mounted elsewhere, and not at all
mounted_elsewhere = [
    path("webhooks-catalog/", include("webhook_receiver.outbound.catalog_urls")),
    path("merchants/hooks/", include("webhook_receiver.portal.urls")),
]
without_the_portal = [
    path("webhooks-catalog/", include("webhook_receiver.outbound.catalog_urls")),
]
METHODS = ("get", "post", "patch", "put", "delete")


class Elsewhere:
    urlpatterns = mounted_elsewhere


class Without:
    urlpatterns = without_the_portal


def operations(document: dict) -> list[tuple[str, str, dict]]:
    return [
        (route, method, operation)
        for route, item in document.get("paths", {}).items()
        for method, operation in item.items()
        if method in METHODS
    ]


def test_the_document_is_openapi_3_1_with_the_events_and_every_route_of_the_api():
    GENERATOR_STATS.reset()
    document = catalog_document()

    assert not GENERATOR_STATS, "drf-spectacular warned: the document guesses somewhere"

    validate(document)  # the OpenAPI 3.1 schema: raises when it does not hold
    assert document["openapi"] == "3.1.0"
    assert "order.paid" in document["webhooks"]
    routes = {"/webhooks-portal/api/" + re.sub(r"<int:(\w+)>", "{id}", str(p.pattern))
              for p in api_urls.urlpatterns}  # fmt: skip
    assert set(document["paths"]) == routes
    assert document["components"]["securitySchemes"] == {
        "bearerAuth": {
            "type": "http",
            "scheme": "bearer",
            "description": "A portal session's key, from POST api/session/ (a link's token "
            "exchanged) or the host's own page.",
        }
    }
    ids = [operation["operationId"] for *_, operation in operations(document)]
    assert len(ids) == len(set(ids)) == 20 and all(i.startswith("portal_") for i in ids)


def test_each_operation_says_the_capability_its_view_checks_and_its_security():
    document = catalog_document()

    for route, method, operation in operations(document):
        view = resolve(route.replace("{id}", "1")).func.view_class  # type: ignore[attr-defined]
        safe = method == "get"
        needed = getattr(view, "read_capability" if safe else "capability", None)
        if operation["operationId"] == "portal_session_open":
            assert (
                "security" not in operation and "No session needed." in (operation["description"])
            )
            assert set(operation["responses"]) == {"201", "400", "403"}
            continue
        assert operation["x-portal-capability"] == needed, operation["operationId"]
        said = f"Needs the capability `{needed}`." if needed else "Any open portal session may."
        assert operation["description"].endswith(said), operation["operationId"]
        assert operation["tags"] == ["portal"]
        assert operation["security"] == [{"bearerAuth": []}]
        assert {"401", "403"} <= set(operation["responses"])


def test_the_documents_requests_and_answers_name_no_secret_but_where_one_is_made():
    document = catalog_document()
    schemas = document["components"]["schemas"]

    holding = [n for n, schema in schemas.items() if "secret" in schema.get("properties", {})]
    assert sorted(holding) == ["PortalEndpointCreated", "PortalRotated"]
    for name, schema in schemas.items():
        if name.startswith("Portal"):
            assert not {"secrets", "retiring_secrets", "tokens", "record_error"} & set(
                schema.get("properties", {})
            ), name
    messages = document["paths"]["/webhooks-portal/api/messages/"]["get"]
    assert {p["name"] for p in messages["parameters"]} == {
        "cursor", "endpoint", "event_type", "status", "since", "until",
    }  # fmt: skip
    listed = messages["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = schemas[listed.rsplit("/", 1)[1]]
    assert set(page["properties"]) == {"next", "previous", "results"}


def test_where_the_host_mounts_the_portal_is_where_the_document_says(settings, client):
    settings.ROOT_URLCONF = Elsewhere
    assert portal_api_prefix() == "/merchants/hooks/api/"

    document = catalog_document()
    validate(document)
    assert document["paths"]
    assert all(p.startswith("/merchants/hooks/api/") for p in document["paths"])
    served = json.loads(client.get("/webhooks-catalog/openapi.json").content)
    assert set(served["paths"]) == set(document["paths"])


def test_without_the_portal_the_document_is_the_events_alone(settings, client):
    settings.ROOT_URLCONF = Without
    assert portal_api_prefix() is None

    document = catalog_document()
    validate(document)
    assert document["paths"] == {} and "securitySchemes" not in document["components"]
    assert "order.paid" in document["webhooks"]
    served = json.loads(client.get("/webhooks-catalog/openapi.json").content)
    assert served == document


@pytest.mark.parametrize("conf", [Elsewhere, Without, None])
def test_the_served_document_follows_the_urlconf_it_is_served_from(settings, client, conf):
    if conf is not None:
        settings.ROOT_URLCONF = conf
    served = json.loads(client.get("/webhooks-catalog/openapi.json").content)
    assert served == catalog_document()
