"""docs/configuration.md's tables of keys, written from the keys' declarations.

    python -m webhook_receiver.conf.docs [path]     (or: make docs)

rewrites what lies between each pair of markers ``<!-- begin generated: NAME -->`` and
``<!-- end generated: NAME -->`` of the page, and leaves the rest, hand-written, as it is.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import REMOVED_KEYS, AppSettings
from .keys import Key, declared
from .sources import REMOVED_SOURCE_KEYS, ActiveHours, ReconcileConfig, SourceConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = "make docs (python -m webhook_receiver.conf.docs)"

_BLOCK = re.compile(
    r"(<!-- begin generated: (?P<name>[\w ]+) -->\n).*?(<!-- end generated: (?P=name) -->)",
    re.DOTALL,
)


def shown(value: Any) -> str:
    """A default as a host would write it in settings.py."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{shown(k)}: {shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def keys_table(cls: type) -> str:
    rows = ["| key | default | accepts | meaning |", "|---|---|---|---|"]
    for declaration in declared(cls).values():
        rows.append(_row(declaration))
    return "\n".join(rows)


def _row(key: Key) -> str:
    default = key.shown_default or f"`{shown(key.default)}`"
    cells = [f"`{key.name}`", default, key.reader.accepts, key.meaning]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def removed_table(removed: Mapping[str, str], source_removed: Mapping[str, str]) -> str:
    named = [(f"`{name}`", instead) for name, instead in sorted(removed.items())]
    named += [(f"a source's `{name}`", instead) for name, instead in sorted(source_removed.items())]
    if not named:
        return "No key has been removed yet."
    rows = ["| removed key | instead |", "|---|---|"]
    return "\n".join(rows + [f"| {name} | {instead} |" for name, instead in named])


TABLES: dict[str, Callable[[], str]] = {
    "keys": lambda: keys_table(AppSettings),
    "source keys": lambda: keys_table(SourceConfig),
    "reconcile keys": lambda: keys_table(ReconcileConfig),
    "active hours keys": lambda: keys_table(ActiveHours),
    "removed keys": lambda: removed_table(REMOVED_KEYS, REMOVED_SOURCE_KEYS),
}


def render(page: str) -> str:
    """``page`` with each generated block written anew; an unknown block name is an error."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"no generated table {name!r}; there are {', '.join(TABLES)}")
        return f"{match[1]}{TABLES[name]()}\n{match[3]}"

    return _BLOCK.sub(block, page)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else PAGE
    text = path.read_text()
    new = render(text)
    if new != text:
        path.write_text(new)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
