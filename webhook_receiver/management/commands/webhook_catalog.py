"""Print the event catalog as an OpenAPI 3.1 document (JSON): manage.py webhook_catalog.

The same document the catalog's view serves (``webhook_receiver.outbound.catalog_urls``):
one ``webhooks`` entry per event type declared with ``@webhook_event``. Svix and Convoy
import it; ``--list`` prints one line per type instead.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...outbound.catalog import catalog
from ...outbound.catalog_document import CatalogUnavailable, catalog_document


class Command(BaseCommand):
    help = "Print the event catalog as an OpenAPI 3.1 document (JSON), or --list its types."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--list", action="store_true", help="one line per event type instead of the document"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            self._list()
            return
        try:
            document = catalog_document()
        except CatalogUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(document, ensure_ascii=False, indent=2))

    def _list(self) -> None:
        entries = catalog()
        if not entries:
            self.stdout.write("no event type is declared (@webhook_event)")
            return
        width = max(len(e.name) for e in entries)
        for entry in entries:
            marks = [f"v{entry.version}"]
            if entry.deprecated:
                marks.append("deprecated")
            if entry.opt_in:
                marks.append("opt-in")
            self.stdout.write(f"{entry.name:<{width}}  {' '.join(marks):<20}  {entry.declared_by}")
