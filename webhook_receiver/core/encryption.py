"""Stored secrets, encrypted at rest: destinations' signing secrets and the secrets of
the inbound sources kept as records (sources/models.py), under the same keys.

A database dump or a backup must not hand out every merchant's signing secret, so the
``secrets`` column holds one Fernet token per secret (AES-128-CBC and HMAC-SHA256, from
``cryptography``) under the keys of ``WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS']``:
the first key encrypts, every key decrypts (MultiFernet), so a key is rotated by putting
a new one first, re-encrypting (``manage.py webhook_destination reencrypt``), then
removing the old one.

``EncryptedSecretsField`` does it in the model: it encrypts on the way to the database
and decrypts in ``from_db_value``, so every reader gets the secrets themselves, the
relay's raw claim (``SELECT d.* …``) included, and nothing else changes. A value that
cannot be decrypted (no key set, or none of them the one that encrypted it) raises
``SecretsUnreadable`` as the row is read: the relay's claim fails before a message is
claimed, never sending one unsigned. What only shows such a row (the admin's
destinations, ``webhook_status``, the deploy check E010) reads the column as stored
(``with_stored_secrets``) and says why (``stored_secrets_problem``); what needs no secret
at all defers the column.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.models import QuerySet
from django.utils.translation import ngettext

from ..conf import NEW_KEY_HINT, app_settings
from ..conf.readers import fernet_key_problem

SETTING = "WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS']"
# a Fernet token: version byte 0x80, a timestamp, an IV, at least one AES block, an HMAC
_TOKEN_MIN_BYTES = 1 + 8 + 16 + 16 + 32


class SecretsUnreadable(ImproperlyConfigured):
    """Stored secrets (a destination's, a source record's) that cannot be encrypted or
    decrypted with the keys set. ``state`` says it in a few words, for a destination's
    row (the admin, webhook_status, the relay's log line); the message says what to do."""

    def __init__(self, message: str, state: str = "secrets unreadable") -> None:
        super().__init__(message)
        self.state = state


class SecretsNotDecrypted(SecretsUnreadable):
    """Tokens that none of the keys set decrypts: the key that encrypted them is gone."""


@functools.lru_cache(maxsize=8)
def _box(keys: tuple[str, ...]) -> MultiFernet:
    """The keys as one box; a malformed key makes every secret unreadable (the settings
    still read: check E011 names it), and is never quoted."""
    for position, key in enumerate(keys, 1):
        problem = fernet_key_problem(key)
        if problem is not None:
            raise SecretsUnreadable(
                f"{SETTING}: key #{position} {problem}. {NEW_KEY_HINT}",
                f"secrets unreadable: key #{position} of SECRET_ENCRYPTION_KEYS is malformed",
            )
    return MultiFernet([Fernet(key) for key in keys])


def _keys(given: Sequence[str] | None) -> tuple[str, ...]:
    """The keys a caller gives (a re-encryption's), else the settings'."""
    return app_settings().secret_encryption_keys if given is None else tuple(given)


def is_token(value: Any) -> bool:
    """Whether ``value`` has a Fernet token's shape (a ``whsec_`` secret never has)."""
    if not isinstance(value, str) or not value.startswith("gAAAAA"):
        return False
    try:
        raw = base64.urlsafe_b64decode(value.encode("ascii"))
    except (binascii.Error, ValueError):
        return False
    return len(raw) >= _TOKEN_MIN_BYTES and raw[0] == 0x80


def secrets_encrypt(secrets: Iterable[str], keys: Sequence[str] | None = None) -> list[str]:
    """One token per secret, under the first key."""
    secrets = list(secrets)
    if not secrets:
        return []
    keys = _keys(keys)
    if not keys:
        raise SecretsUnreadable(
            f"Signing secrets (destinations', source records') are encrypted at rest, and "
            f"{SETTING} is empty: set at least one key. {NEW_KEY_HINT}"
        )
    box = _box(keys)
    return [box.encrypt(secret.encode()).decode("ascii") for secret in secrets]


def secrets_decrypt(tokens: Iterable[Any], keys: Sequence[str] | None = None) -> list[str]:
    """The secrets of stored ``tokens``, by whichever key encrypted each."""
    tokens = list(tokens)
    if not tokens:
        return []
    keys = _keys(keys)
    if not keys:
        raise SecretsUnreadable(
            f"Stored signing secrets are encrypted, and {SETTING} is empty: set the key "
            "they were encrypted with.",
            "secrets unreadable: no key is set",
        )
    if not all(is_token(token) for token in tokens):
        raise SecretsUnreadable(
            "A destination's secrets are stored unencrypted: run manage.py migrate "
            "(migration webhook_receiver 0010 encrypts them), or set them again.",
            "secrets unreadable: stored unencrypted",
        )
    box = _box(keys)
    try:
        return [box.decrypt(token.encode("ascii")).decode() for token in tokens]
    except InvalidToken:
        n = len(keys)
        raise SecretsNotDecrypted(
            "Stored signing secrets (a destination's or a source record's) cannot be "
            f"decrypted: none of the {n} key(s) "
            f"of {SETTING} is the one they were encrypted with (a key removed before "
            "manage.py webhook_destination reencrypt ran?). Put that key back, or set "
            "new secrets.",
            ngettext(
                "secrets unreadable: none of the %d key decrypts them",
                "secrets unreadable: none of the %d keys decrypts them",
                n,
            )
            % n,
        ) from None


def stored_secrets_problem(
    stored: Any, keys: Sequence[str] | None = None
) -> SecretsUnreadable | None:
    """What reading a destination whose secrets column holds ``stored`` (its JSON, or
    that parsed) would raise, or None when it reads: for the pages and checks that show
    such a row rather than fail on it."""
    values = json.loads(stored) if isinstance(stored, str) else stored
    if not isinstance(values, list):
        return None
    try:
        secrets_decrypt(values, keys)
    except SecretsUnreadable as exc:
        return exc
    return None


def secrets_unreadable(row: Any) -> SecretsUnreadable | None:
    """Why a row read through ``with_stored_secrets`` (a destination, a source record)
    cannot have its secrets read (a destination's rotation's outgoing ones too), or None."""
    for stored in (getattr(row, "stored_secrets", None), getattr(row, "stored_retiring", None)):
        problem = None if stored is None else stored_secrets_problem(stored)
        if problem is not None:
            return problem
    return None


def with_stored_secrets(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """Rows (destinations, source records) whose secrets are not decrypted as they are
    read (a row no key reads would raise, and fail the whole page): ``stored_secrets``
    holds the column as stored, for ``secrets_unreadable`` and for counting them (and a
    destination's ``stored_retiring``, its rotation's outgoing ones)."""
    stored = {"stored_secrets": "secrets"}
    if any(f.name == "retiring_secrets" for f in queryset.model._meta.fields):
        stored["stored_retiring"] = "retiring_secrets"  # a destination's rotation's
    return queryset.defer(*stored.values()).annotate(
        **{
            name: models.ExpressionWrapper(models.F(column), output_field=models.JSONField())
            for name, column in stored.items()
        }
    )


class EncryptedSecretsField(models.JSONField):
    """A list of secrets, stored as a JSON list of Fernet tokens and read back as the
    secrets themselves. Serialised (dumpdata) as the tokens, which are stored as they
    are when loaded back (loaddata)."""

    def get_prep_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            plain = [item for item in value if not is_token(item)]
            tokens = iter(secrets_encrypt(plain))
            value = [item if is_token(item) else next(tokens) for item in value]
        return super().get_prep_value(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        stored = super().from_db_value(value, expression, connection)
        return secrets_decrypt(stored) if isinstance(stored, list) else stored

    def value_to_string(self, obj: models.Model) -> Any:
        return self.get_prep_value(self.value_from_object(obj))
