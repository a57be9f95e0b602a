"""How a settings key is declared, once: a field of a frozen dataclass made by ``key()``,
which carries the key's name, its default, its reader (what it accepts, checked and
converted into the field's type) and its meaning. The typed settings object, the
defaults, the validation and docs/configuration.md's tables (conf/docs.py) all come
from these declarations; no key is spelled anywhere else under conf/.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# the Django setting that holds every key
SETTING = "WEBHOOK_RECEIVER"

_METADATA = "webhook_receiver.key"
NOTHING_REMOVED: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Reader:
    """What a key accepts, in a few words for the docs, and the function that checks a
    value and converts it: ``read(value, where)``, ``where`` naming the key for its
    error (``WEBHOOK_RECEIVER['PURGE_BATCH_SIZE']``). It raises ImproperlyConfigured;
    a TypeError or ValueError it lets through becomes one, prefixed with ``where``."""

    accepts: str
    read: Callable[[Any, str], Any]


def reader(accepts: str) -> Callable[[Callable[[Any, str], Any]], Reader]:
    """A function ``(value, where) -> converted`` as a Reader accepting ``accepts``."""
    return lambda read: Reader(accepts, read)


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    reader: Reader
    meaning: str
    # the default as the docs show it, where its value alone would mislead ("required")
    shown_default: str | None = None


def key(
    name: str,
    default: Any,
    reader: Reader,
    meaning: str,
    *,
    shown_default: str | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field declared as the key ``name``. The field has no default of its
    own: ``read_keys`` gives every field its value, the default read like any other. A
    ``secret`` is left out of the settings object's repr (a traceback or a log line may
    show it)."""
    declaration = Key(name, default, reader, meaning, shown_default)
    return field(repr=not secret, metadata={_METADATA: declaration})


def declared(cls: type) -> dict[str, Key]:
    """The keys declared on the dataclass ``cls``: field name -> Key, in declaration order."""
    return {f.name: f.metadata[_METADATA] for f in fields(cls) if _METADATA in f.metadata}


def key_name(cls: type, attribute: str) -> str:
    """The key read into ``cls``'s ``attribute``, for a message that names it."""
    return declared(cls)[attribute].name


def key_default(cls: type, attribute: str) -> Any:
    """The default of the key read into ``cls``'s ``attribute`` (as a host would write
    it), for a model whose columns hold the same values."""
    return declared(cls)[attribute].default


def options_of(cls: type, **values: Any) -> dict[str, Any]:
    """Values given by ``cls``'s attribute names, as the options a host writes (by key
    name): what holds them elsewhere (a source kept as a record) is read by the same
    readers, without spelling the keys again. An unknown attribute is a KeyError."""
    keys = declared(cls)
    return {keys[attribute].name: value for attribute, value in values.items()}


def read_keys(
    cls: type, options: Any, where: str, removed: Mapping[str, str] = NOTHING_REMOVED
) -> dict[str, Any]:
    """``options`` (a dict of keys, as a host writes it) read into the values of ``cls``'s
    fields: each key given or its default, through its reader. A removed key is refused
    with what replaces it, an unknown one as unknown."""
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict, not {type(options).__name__}.")
    for name in options:
        if name in removed:
            raise ImproperlyConfigured(
                f"{where}[{name!r}] has been removed: {removed[name]}. Remove it from {where}."
            )
    keys = declared(cls)
    unknown = set(options) - {k.name for k in keys.values()}
    if unknown:
        raise ImproperlyConfigured(f"{where} has unknown keys: {sorted(unknown)}")
    values = {}
    for attribute, declaration in keys.items():
        here = f"{where}[{declaration.name!r}]"
        try:
            values[attribute] = declaration.reader.read(
                options.get(declaration.name, declaration.default), here
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{here}: {exc}") from exc
    return values
