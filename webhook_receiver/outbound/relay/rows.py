"""The destinations' rows as a round reads them: locked (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, in id order), each converted as the model reads it, its secrets decrypted,
with its version (PostgreSQL's ``xmin``: every write of the row changes it).

A relay keeps the rows it read (``Rows``) and the version each has after its own
writes: its next round for a destination decides from that row and writes only if the
version is still the same (round.py), with no read of its own. Anything that changed
the row in between (another relay's round, an operator's edit) changed its version, and
the round reads it again under lock. So nothing a relay keeps can act on a row that
disagrees with the table.

Decrypting is the costly part of reading a row (a Fernet token a secret), so a row's
secrets are decrypted once per stored value and process: a change of secrets is a new
stored value, so nothing kept can disagree with the row. A row whose secrets no key
decrypts is read all the same, without them, its problem beside it: its answers are
recorded, and nothing is claimed for it (the engine says so, once in a while).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from typing import Any

from django.db import connection

from ...conf import app_settings
from ...core.encryption import SecretsUnreadable, secrets_decrypt
from .. import queries
from ..models import WebhookDestination

Row = tuple[WebhookDestination, SecretsUnreadable | None]
# rows a relay keeps at most (the destinations it relayed lately)
ROWS_KEPT = 4096


class Rows:
    """A relay's rows, by destination: the row as its last round left it, its version,
    and its secrets' problem, if any. The least recently used go first."""

    def __init__(self, size: int = ROWS_KEPT) -> None:
        self._size = size
        self._rows: OrderedDict[int, tuple[WebhookDestination, str, SecretsUnreadable | None]] = (
            OrderedDict()
        )

    def get(
        self, destination_id: int
    ) -> tuple[WebhookDestination, str, SecretsUnreadable | None] | None:
        found = self._rows.get(destination_id)
        if found is not None:
            self._rows.move_to_end(destination_id)
        return found

    def keep(
        self,
        dest: WebhookDestination,
        version: str,
        unreadable: SecretsUnreadable | None,
    ) -> None:
        self._rows[dest.pk] = (dest, version, unreadable)
        self._rows.move_to_end(dest.pk)
        while len(self._rows) > self._size:
            self._rows.popitem(last=False)

    def forget(self, destination_id: int) -> None:
        self._rows.pop(destination_id, None)


def destinations_locked(ids: list[int]) -> dict[int, Row]:
    """The rows of ``ids`` that this round holds, each as the model reads it (its secrets
    decrypted; a row whose secrets no key decrypts has none, and its problem beside it)."""
    if not ids:
        return {}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(queries.DESTINATIONS_LOCKED, {"ids": ids})
        else:
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(queries.DESTINATIONS_SQLITE.format(ids=marks), ids)
        names = [column[0] for column in cursor.description]
        rows = cursor.fetchall()
    found = {}
    for values in rows:
        dest, unreadable = destination_from_row(dict(zip(names, values, strict=True)))
        found[dest.pk] = (dest, unreadable)
    return found


def destination_from_row(row: dict[str, Any]) -> Row:
    """The destination of a row holding its columns, each converted as the model reads
    it, without resolving the columns again each round; the row's other columns are set
    beside its fields. Its secrets are decrypted once per stored value and process
    (a change of secrets is a new value: nothing kept can disagree with the row)."""
    attnames, converters, columns = _destination_fields(connection.vendor)
    values = []
    unreadable = None
    for column, expression, convert in converters:
        value = row[column]
        if column == "secrets":
            value, unreadable = _secrets(value)
        else:
            for step in convert:
                value = step(value, expression, connection)
        values.append(value)
    dest = WebhookDestination.from_db(connection.alias, attnames, values)
    for name, value in row.items():
        if name not in columns:
            setattr(dest, name, value)
    return dest, unreadable


@functools.cache
def _destination_fields(
    vendor: str,
) -> tuple[list[str], list[tuple[str, Any, list[Any]]], frozenset[str]]:
    """The model's attribute names; its columns, each with the expression and the
    converters a query of the ORM applies to it (the database's own, SQLite's text to
    datetime, then the field's); and the columns."""
    fields = WebhookDestination._meta.concrete_fields
    table = WebhookDestination._meta.db_table
    converters = []
    for f in fields:
        expression = f.get_col(table)
        steps = connection.ops.get_db_converters(expression)
        steps += expression.get_db_converters(connection)
        converters.append((f.column, expression, steps))
    return [f.attname for f in fields], converters, frozenset(f.column for f in fields)


def _secrets(stored: Any) -> tuple[list[str], SecretsUnreadable | None]:
    text = stored if isinstance(stored, str) else json.dumps(stored)
    return _secrets_decrypted(text, app_settings().secret_encryption_keys)


@functools.lru_cache(maxsize=1024)
def _secrets_decrypted(
    stored: str, keys: tuple[str, ...]
) -> tuple[list[str], SecretsUnreadable | None]:
    values = json.loads(stored)
    if not isinstance(values, list):
        return [], None
    try:
        return secrets_decrypt(values, keys), None
    except SecretsUnreadable as exc:
        return [], exc
