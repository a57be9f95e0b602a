"""Every relative link of README.md, CHANGELOG.md and docs/*.md leads somewhere, and
every docs page the code names exists: a page renamed or a heading reworded breaks a
test, not a reader.

Anchors follow GitHub's rule for headings: lowercased, punctuation dropped (letters,
digits, '_', '-' and spaces stay), each space a '-', and a repeated heading's anchor
suffixed -1, -2, …
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and [text](target "title"); images too. Autolinks (<https://…>) and
# reference-style links are not used in these pages.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")

# Where code, templates and deploy files name a docs page: "docs/<page>.md", with an
# anchor when one is given.
NAMED_PAGE = re.compile(r"docs/([A-Za-z0-9_-]+\.md)(#[A-Za-z0-9_-]+)?")
CODE_DIRS = ("webhook_receiver", "project", "tests", "deploy", ".ci")
CODE_FILES = ("Makefile", "pyproject.toml")
CODE_SUFFIXES = {".py", ".html", ".txt", ".yml", ".yaml", ".json", ".conf", ".toml", ""}


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before any -1, -2 suffix)."""
    text = INLINE_CODE.sub(lambda code: code.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, with inline code blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else INLINE_CODE.sub("``", line))
    return lines


def headings_with_code(page: Path) -> list[str]:
    """Headings read with their inline code, which prose_lines blanks out."""
    headings, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := HEADING.match(line)):
            headings.append(heading.group(2))
    return headings


@cache
def page_anchors(page: Path) -> frozenset[str]:
    seen: Counter[str] = Counter()
    found = set()
    for heading in headings_with_code(page):
        anchor = github_anchor(heading)
        found.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
        seen[anchor] += 1
    return frozenset(found)


def links(page: Path) -> list[str]:
    """Every link target of the page's prose; a link's text may run over a line's end."""
    prose = "\n".join(prose_lines(page.read_text()))
    return [match.group(1) for match in LINK.finditer(prose)]


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, leads nowhere; None when it resolves."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …: not ours to check
        return None
    path_part, _, anchor = target.partition("#")
    linked = (page.parent / path_part).resolve() if path_part else page
    if not linked.exists():
        return "no such file"
    if anchor and linked.suffix == ".md" and anchor not in page_anchors(linked):
        return f"no heading with the anchor #{anchor}"
    return None


def test_anchors_follow_githubs_rule():
    assert github_anchor("What an answer means (`verdict`)") == "what-an-answer-means-verdict"
    assert github_anchor("`manage.py webhook_status [--json]`") == (
        "managepy-webhook_status---json"
    )
    assert github_anchor("The client's address") == "the-clients-address"
    assert github_anchor("Standard Webhooks `v1a`: Ed25519 public keys") == (
        "standard-webhooks-v1a-ed25519-public-keys"
    )
    assert github_anchor("Recover since…") == "recover-since"
    assert github_anchor("One event's story — trace") == "one-events-story--trace"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_and_anchor_resolves(page):
    failures = [
        f"{page.name}: ({target}): {why}" for target in links(page) if (why := broken(page, target))
    ]
    assert failures == []


def code_files() -> list[Path]:
    files = [ROOT / name for name in CODE_FILES]
    for directory in CODE_DIRS:
        files += [
            path
            for path in (ROOT / directory).rglob("*")
            if path.is_file() and path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts
        ]
    return files


def missing_pages_named() -> list[tuple[str, int, str]]:
    """(file, line, "docs/<page>.md[#anchor]") for each named page or anchor that is not
    there."""
    missing = []
    for path in code_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in NAMED_PAGE.finditer(line):
                page, anchor = ROOT / "docs" / match.group(1), (match.group(2) or "#")[1:]
                if not page.exists() or (anchor and anchor not in page_anchors(page)):
                    missing.append((path.relative_to(ROOT).as_posix(), number, match.group(0)))
    return missing


def test_every_docs_page_the_code_names_exists():
    missing = [f"{name}:{number}: {named}" for name, number, named in missing_pages_named()]
    assert missing == []


def test_the_docs_stay_at_twelve_pages_or_fewer():
    # a reader finds a subject by the page's name: a new subject is a section of the page
    # it belongs to (the portal is sending's, reconciliation watching's, the fault run
    # testing's), not a page of its own
    assert len(sorted((ROOT / "docs").glob("*.md"))) <= 12
