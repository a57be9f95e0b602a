"""Plain INSERT and UPDATE statements for the hot path, and the pieces to build others.

Two reasons to leave the ORM here: it cannot say ``ON CONFLICT … DO NOTHING RETURNING``,
which is how the claim learns whether it won (services/claim.py composes that statement
from ``table``, ``columns``, ``placeholders`` and ``params``); and for these small
statements its machinery (model instances, the SQL compiler) costs more CPU than the
database work.
Values are adapted by each field's ``get_db_prep_save``, as the ORM would adapt them, on
PostgreSQL and on SQLite alike; text and integer fields, whose values the drivers take
as they are, skip that step (a measurable cost on a path that runs per request).
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


@functools.cache
def _fields(model: type[models.Model]) -> dict[str, models.Field]:
    return {f.name: f for f in model._meta.concrete_fields}


@functools.cache
def _adapters(
    model: type[models.Model], names: tuple[str, ...], vendor: str
) -> tuple[models.Field | None, ...]:
    """Per column, None when the value goes to the driver as it is, else the field."""
    fields = _fields(model)
    as_is = PASSED_AS_IS.get(vendor, ())
    return tuple(None if isinstance(fields[name], as_is) else fields[name] for name in names)


def params(model: type[models.Model], names: tuple[str, ...], row: Mapping[str, Any]) -> list:
    """The values of ``row`` for ``names``, adapted for the database where needed."""
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: the fields look it up repeatedly
    adapters = _adapters(model, names, db.vendor)
    return [
        plain(row[name]) if field is None else field.get_db_prep_save(row[name], db)
        for name, field in zip(names, adapters, strict=True)
    ]


def plain(value: Any) -> Any:
    """A choices member as its plain value. psycopg finds the dumper of a str subclass by
    walking its MRO on every statement, which costs more than the rest of its dumping."""
    return value.value if isinstance(value, Enum) else value


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def columns(model: type[models.Model], names: Sequence[str]) -> str:
    return ", ".join(column(model, name) for name in names)


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def column(model: type[models.Model], name: str) -> str:
    return connection.ops.quote_name(_fields(model)[name].column)


def insert(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT ``rows`` (field name -> value, the same names in every row) in one statement."""
    names = tuple(rows[0])
    values = [value for row in rows for value in params(model, names, row)]
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(model, names, len(rows)), values)


def update(model: type[models.Model], pk: Any, values: Mapping[str, Any]) -> None:
    """UPDATE one row, by primary key."""
    names = tuple(values)
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(model, names), [*params(model, names, values), pk])


# The statements' text depends only on these arguments: build each once per process.


@functools.cache
def _insert_sql(model: type[models.Model], names: tuple[str, ...], row_count: int) -> str:
    row = f"({placeholders(len(names))})"
    return (
        f"INSERT INTO {table(model)} ({columns(model, names)}) "
        f"VALUES {', '.join([row] * row_count)}"
    )


@functools.cache
def _update_sql(model: type[models.Model], names: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{column(model, name)} = %s" for name in names)
    return (
        f"UPDATE {table(model)} SET {assignments} WHERE {column(model, model._meta.pk.name)} = %s"
    )
