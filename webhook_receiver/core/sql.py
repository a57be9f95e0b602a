"""Helpers for raw SQL: values adapted as the ORM would, and batched multi-row INSERTs.

The receive path's statements are in ``queries.py``; a host's handlers can use these
helpers for their own (the demo shop does). Values are adapted by each model field's
``get_db_prep_save``, as the ORM would adapt them, on PostgreSQL and on SQLite alike;
values that the driver takes as they are skip that step (a measurable cost on a path
that runs per request).

Only the ``default`` database is used: the receive path runs on
``django.db.connection``, like the transactions around it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

# Fields whose values the driver takes as they are (our values are always of the field's
# own Python type, datetimes always aware, IP addresses already validated by the audit
# draft). JSON always needs its adapter.
PASSED_AS_IS: dict[str, tuple[type[models.Field], ...]] = {
    "postgresql": (
        models.CharField,
        models.TextField,
        models.IntegerField,
        models.DateTimeField,
        models.BinaryField,
        models.GenericIPAddressField,
    ),
    "sqlite": (models.CharField, models.TextField, models.IntegerField),
}
# PostgreSQL's wire protocol counts a statement's parameters in 16 bits; SQLite's limit
# is the driver's feature flag.
MAX_PARAMS = {"postgresql": 65535}


@functools.cache
def _adapters(
    models_: tuple[type[models.Model], ...], names: tuple[str, ...], vendor: str
) -> tuple[models.Field | None, ...]:
    """Per name, None when the value goes to the driver as it is, else the field (of the
    first model that has one by that name) that adapts it. Names of no field pass as is."""
    as_is = PASSED_AS_IS.get(vendor, ())
    fields: dict[str, models.Field] = {}
    for model in reversed(models_):
        fields.update({f.name: f for f in model._meta.concrete_fields})
    found = (fields.get(name) for name in names)
    return tuple(None if field is None or isinstance(field, as_is) else field for field in found)


def adapt(row: Mapping[str, Any], *model: type[models.Model]) -> dict[str, Any]:
    """``row`` (field name -> value) with each value adapted for the database as the
    field of that name in ``model`` would adapt it."""
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: the fields look it up repeatedly
    names = tuple(row)
    adapters = _adapters(model, names, db.vendor)
    return {
        name: plain(row[name]) if field is None else field.get_db_prep_save(row[name], db)
        for name, field in zip(names, adapters, strict=True)
    }


def plain(value: Any) -> Any:
    """A choices member as its plain value. psycopg finds the dumper of a str subclass by
    walking its MRO on every statement, which costs more than the rest of its dumping."""
    return value.value if isinstance(value, Enum) else value


def insert_rows(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT ``rows`` (field name -> value, the same names in every row): one statement,
    or as few as the driver's parameter limit allows."""
    if not rows:
        return
    names = tuple(rows[0])
    limit = MAX_PARAMS.get(connection.vendor) or connection.features.max_query_params or 999
    per_statement = max(1, limit // len(names))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            batch = rows[start : start + per_statement]
            values = [v for row in batch for v in adapt(row, model).values()]
            cursor.execute(_insert_sql(model, names, len(batch)), values)


@functools.lru_cache(maxsize=256)
def _insert_sql(model: type[models.Model], names: tuple[str, ...], row_count: int) -> str:
    quote = connection.ops.quote_name
    fields = {f.name: f for f in model._meta.concrete_fields}
    columns = ", ".join(quote(fields[name].column) for name in names)
    row = f"({', '.join(['%s'] * len(names))})"
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
        f"VALUES {', '.join([row] * row_count)}"
    )
