"""docs/configuration.md's tables of keys are the keys' declarations (conf/docs.py writes
them): the committed page says what the code reads, and its links lead somewhere."""

from __future__ import annotations

import re

from tests.support.paths import REPO
from webhook_receiver.conf.docs import COMMAND, TABLES, render

PAGE = REPO / "docs" / "configuration.md"
LINK = re.compile(r"\]\((?P<target>[^)#\s]+\.md)(?:#(?P<anchor>[^)\s]+))?\)")


def test_the_page_shows_what_the_declarations_say():
    page = PAGE.read_text()
    assert page == render(page), (
        "docs/configuration.md's tables of keys differ from their declarations in "
        f"webhook_receiver/conf/: run {COMMAND} and commit the page."
    )


def test_the_page_has_a_place_for_every_table():
    page = PAGE.read_text()
    found = re.findall(r"<!-- begin generated: ([\w ]+) -->", page)
    assert sorted(found) == sorted(TABLES)


def anchors(path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_of_the_tables_leads_to_a_page_and_a_heading():
    tables = "\n".join(table() for table in TABLES.values())
    links = list(LINK.finditer(tables))
    broken = []
    for link in links:
        target = (PAGE.parent / link["target"]).resolve()
        leads = target.is_file() and (not link["anchor"] or link["anchor"] in anchors(target))
        if not leads:
            broken.append(link[0])
    assert links and broken == []
