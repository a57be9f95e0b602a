"""The event catalog as a merchant reads it: every type, by group, with its description,
version, marks (deprecated, opt-in), example and JSON schema. The endpoint form shows the
same entries beside its checkboxes (``catalog_groups`` with what is ticked).

The schemas come from the catalog's OpenAPI document (catalog_document.py, made by
drf-spectacular), each type's envelope with its references written in place; made once
per catalog revision and process, as the document's own view caches it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.text import slugify
from django.views.decorators.http import require_safe

from ...outbound.catalog import EventType, revision
from ...outbound.catalog_document import CatalogUnavailable, catalog_document
from ...outbound.endpoints import offered_catalog
from ...presentation.display import json_text
from ..guard import PortalRequest, portal_page

# how deep a schema's references are written in place (a serializer that nests itself
# keeps its reference past this)
REFERENCE_DEPTH = 8


@dataclass(frozen=True)
class TypeShown:
    entry: EventType
    example: str
    schema: str
    checked: bool = False

    @property
    def field_id(self) -> str:
        return "sub-" + slugify(self.entry.name.replace(".", "-"))


@dataclass(frozen=True)
class GroupShown:
    name: str
    # its group.* pattern (None: its types are all opt-in, or its name has no group)
    pattern: str | None
    pattern_checked: bool = False
    types: list[TypeShown] = field(default_factory=list)

    @property
    def pattern_id(self) -> str:
        return "sub-" + slugify(self.name.replace(".", "-")) + "-all"

    @property
    def opt_in_count(self) -> int:
        return sum(1 for t in self.types if t.entry.opt_in)


def example_text(entry: EventType) -> str:
    """The example as a message's body carries it (the envelope), indented; "" without
    one."""
    if entry.example is None:
        return ""
    return json_text({"type": entry.name, "data": dict(entry.example)})


def catalog_groups(selected: Iterable[str] = ()) -> list[GroupShown]:
    """The catalog by group, each type with its example and schema; ``selected``: the
    subscriptions ticked (names and ``group.*`` patterns)."""
    ticked = set(selected)
    schemas = type_schemas(revision())
    groups: dict[str, GroupShown] = {}
    for entry in offered_catalog():
        name = entry.group
        if name not in groups:
            groups[name] = GroupShown(name, None, False, [])
        shown = TypeShown(
            entry, example_text(entry), schemas.get(entry.name, ""), entry.name in ticked
        )
        groups[name].types.append(shown)
    result = []
    for name in sorted(groups):
        found = groups[name]
        reaches = any("." in t.entry.name and not t.entry.opt_in for t in found.types)
        pattern = f"{name}.*" if reaches else None
        result.append(GroupShown(name, pattern, pattern in ticked, found.types))
    return result


@functools.lru_cache(maxsize=1)
def type_schemas(catalog_revision: int) -> dict[str, str]:
    """Each type's envelope as a JSON schema, indented, its references in place; {} when
    the document cannot be made here (the page then says so)."""
    try:
        document: dict[str, Any] = catalog_document()
    except CatalogUnavailable:
        return {}
    components = document.get("components", {}).get("schemas", {})
    found = {}
    for name, hook in document.get("webhooks", {}).items():
        try:
            schema = hook["post"]["requestBody"]["content"]["application/json"]["schema"]
        except (KeyError, TypeError):
            continue
        found[name] = json_text(_in_place(schema, components, 0))
    return found


def _in_place(node: Any, components: dict[str, Any], depth: int) -> Any:
    """``node`` with each ``$ref`` to a component replaced by the component itself (to
    REFERENCE_DEPTH), and drf-spectacular's own ``x-spec-*`` marks left out."""
    if isinstance(node, list):
        return [_in_place(item, components, depth) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/") and depth < REFERENCE_DEPTH:
        target = components.get(ref.rsplit("/", 1)[1])
        if isinstance(target, dict):
            return _in_place(target, components, depth + 1)
    return {
        key: _in_place(value, components, depth)
        for key, value in node.items()
        if not key.startswith("x-spec-")
    }


@portal_page()
@require_safe
def catalog_page(request: PortalRequest) -> HttpResponse:
    groups = catalog_groups()
    context = {
        "section": "catalog",
        "groups": groups,
        "schemas_missing": bool(groups) and not type_schemas(revision()),
    }
    return render(request, "webhook_receiver/portal/catalog.html", context)
