"""Misconfiguration surfaces as system checks with stable ids."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.utils.module_loading import import_string

from . import schemes
from .conf import NEW_KEY_HINT, app_settings
from .conf.readers import fernet_key_problem
from .core.encryption import SecretsNotDecrypted, is_token, secrets_decrypt
from .inbound.handlers import registration_conflicts
from .outbound import catalog as event_catalog
from .outbound.models import WebhookDestination
from .outbound.selectors import destinations_unreadable
from .reconcile.adapters import BUILT_IN
from .reconcile.states import state_comparison
from .schemes.base import SECRET_MIN_BYTES, weak_secret_problem
from .sources.models import WebhookSource
from .watch.notifiers import get_notifiers

# the bearer token /metrics/ requires: as long as a signing secret's key material
METRICS_TOKEN_MIN_CHARS = SECRET_MIN_BYTES
WEAK_SECRET_HINT = (
    f"Ask the sender for a secret of at least {SECRET_MIN_BYTES} random bytes (GitHub: "
    "generate one and type it into the webhook's settings), and roll to it (list both "
    "while the sender switches)."
)


@checks.register()
def check_webhook_receiver_settings(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    try:
        config = app_settings()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="webhook_receiver.E001")]
    errors: list[checks.CheckMessage] = []
    for position, fernet_key in enumerate(config.secret_encryption_keys, 1):
        problem = fernet_key_problem(fernet_key)
        if problem:  # the key is never quoted: its position names it
            errors.append(
                checks.Error(
                    f"WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS']: key #{position} {problem}: "
                    "no stored secret (a destination's, a source record's) can be read or "
                    "written until it is fixed.",
                    hint=NEW_KEY_HINT,
                    id="webhook_receiver.E011",
                )
            )
    for slug, source in config.sources.items():
        scheme = schemes.get_scheme(source.scheme)
        for position, secret in enumerate(source.secrets):
            problem = scheme.secret_problem(secret)
            if problem:
                errors.append(
                    checks.Error(
                        f"Secret #{position + 1} of source {slug!r} {problem}.",
                        hint="Copy the signing secret exactly as the sender shows it.",
                        id="webhook_receiver.E002",
                    )
                )
            elif weak := weak_secret_problem(scheme, secret):
                errors.append(
                    checks.Warning(
                        f"Secret #{position + 1} of source {slug!r} {weak}.",
                        hint=WEAK_SECRET_HINT,
                        id="webhook_receiver.W003",
                    )
                )
        for name, value in (
            ("TOLERANCE_SECONDS", source.tolerance_seconds),
            ("MAX_BODY_BYTES", source.max_body_bytes),
        ):
            if value <= 0:
                errors.append(
                    checks.Error(
                        f"Source {slug!r}: {name} must be positive, not {value}.",
                        id="webhook_receiver.E003",
                    )
                )
    paths: list[tuple[str, str | None]] = [
        (f"['HANDLERS'][{t!r}]", p) for t, p in config.handlers.items()
    ]
    paths += [(f"['SOURCES'][{s!r}]['EVENT_KEY']", c.event_key) for s, c in config.sources.items()]
    paths += [
        (
            f"['SOURCES'][{s!r}]['RECONCILE']['ADAPTER']",
            BUILT_IN.get(c.reconcile.adapter, c.reconcile.adapter),
        )
        for s, c in config.sources.items()
        if c.reconcile is not None
    ]
    paths.append(("['TRACE_EFFECTS']", config.trace_effects))
    for where, path in paths:
        if not path:
            continue
        try:
            import_string(path)
        except ImportError as exc:
            errors.append(
                checks.Error(
                    f"WEBHOOK_RECEIVER{where} = {path!r} cannot be imported: {exc}",
                    id="webhook_receiver.E004",
                )
            )
    try:
        state_comparison(config.state_comparison)
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="webhook_receiver.E004"))
    for event_type, names in registration_conflicts().items():
        overridden = event_type in config.handlers
        if not overridden:
            errors.append(
                checks.Error(
                    f"Event type {event_type!r} has {len(names)} handlers registered in code: "
                    f"{', '.join(names)}.",
                    hint="Keep one @webhook_handler per event type, or choose one in "
                    f"WEBHOOK_RECEIVER['HANDLERS'][{event_type!r}].",
                    id="webhook_receiver.E005",
                )
            )
    try:
        get_notifiers()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="webhook_receiver.E006"))
    errors += database_problems(settings.DATABASES)
    token = config.metrics_token
    if token is not None and len(token) < METRICS_TOKEN_MIN_CHARS:
        errors.append(
            checks.Warning(
                f"WEBHOOK_RECEIVER['METRICS_TOKEN'] is {len(token)} characters long, fewer "
                f"than {METRICS_TOKEN_MIN_CHARS}: a short bearer token can be guessed.",
                hint='Use a long random string, e.g. python -c "import secrets; '
                'print(secrets.token_urlsafe(32))".',
                id="webhook_receiver.W004",
            )
        )
    if not config.sources:
        errors.append(
            checks.Warning(
                "WEBHOOK_RECEIVER['SOURCES'] is empty: every webhook will be answered 404, "
                "but those to a source kept as a record (manage.py webhook_source).",
                id="webhook_receiver.W001",
            )
        )
    return errors


@checks.register()
def check_event_catalog(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The event catalog (outbound/catalog.py): one declaration per type (E012), examples
    their serializers accept (E013), and, where the host serves its document, the DRF
    schema class drf-spectacular needs to make it (W007)."""
    errors: list[checks.CheckMessage] = []
    for name, declared in event_catalog.conflicts().items():
        errors.append(
            checks.Error(
                f"Event type {name!r} is declared {len(declared)} times, differently: "
                f"{', '.join(declared)}.",
                hint="Keep one @webhook_event per event type.",
                id="webhook_receiver.E012",
            )
        )
    for entry in event_catalog.catalog():
        problem = event_catalog.example_problem(entry)
        if problem is not None:
            errors.append(
                checks.Error(
                    f"The example of event type {entry.name!r} is not data its serializer "
                    f"accepts: {problem}",
                    hint="Correct the example=, or the serializer.",
                    id="webhook_receiver.E013",
                )
            )
    if event_catalog.catalog() and _catalog_mounted():
        from .outbound.catalog_document import schema_class_problem

        problem = schema_class_problem()
        if problem is not None:
            errors.append(
                checks.Warning(
                    f"The event catalog's document is served here, and cannot be made: {problem}.",
                    hint="Set it in REST_FRAMEWORK; the catalog's view answers 503 until then.",
                    id="webhook_receiver.W007",
                )
            )
    return errors


def _catalog_mounted() -> bool:
    from django.urls import NoReverseMatch, reverse

    try:
        reverse("webhook_catalog")
    except NoReverseMatch:
        return False
    return True


# the outbox relay claims and records with UPDATE … RETURNING
SQLITE_MINIMUM = (3, 35)


def database_problems(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    uses_sqlite = any(db.get("ENGINE", "").endswith("sqlite3") for db in databases.values())
    if uses_sqlite and sqlite3.sqlite_version_info < SQLITE_MINIMUM:
        return [
            checks.Error(
                f"SQLite {sqlite3.sqlite_version} is too old: the outbox relay needs "
                f"{'.'.join(map(str, SQLITE_MINIMUM))} or newer (UPDATE … RETURNING).",
                hint="Use a Python built with a newer SQLite, or PostgreSQL.",
                id="webhook_receiver.E007",
            )
        ]
    return []


def _raw_rows(databases: Iterable[str] | None, sql: str) -> Iterator[list[tuple[Any, ...]]]:
    """Each database's rows of ``sql``, skipping a database whose table is not there yet
    (a database check runs before migrating)."""
    for alias in databases or ():
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute(sql)
                rows = cursor.fetchall()
        except DatabaseError:
            continue  # not migrated yet
        yield rows


@checks.register(checks.Tags.database)
def check_destination_secrets(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Whether destinations' secrets can be encrypted at rest. A database check: Django
    runs it on ``migrate`` and ``check --database``, before migrating, so rows not yet
    encrypted are a warning (the migration encrypts them) unless no key is set to
    encrypt them with. Whether the keys set decrypt them is E010, a deploy check: rows
    no key reads are shown and reported where they are, and do not stop a migration."""
    try:
        keys = app_settings().secret_encryption_keys
    except ImproperlyConfigured:
        return []  # E001 says why
    table = WebhookDestination._meta.db_table
    problems: list[checks.CheckMessage] = []
    # raw: the model's field would decrypt, and raise, on the first bad row
    for rows in _raw_rows(databases, f"SELECT name, secrets FROM {table} ORDER BY name"):
        for name, stored in rows:
            values = json.loads(stored) if isinstance(stored, str) else stored
            values = values if isinstance(values, list) else []
            tokens = [v for v in values if is_token(v)]
            if values and not keys:
                problems.append(
                    checks.Error(
                        f"Destination {name!r} has signing secrets, and "
                        "WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS'] is empty: they are "
                        "encrypted at rest with its first key.",
                        hint=f"{NEW_KEY_HINT}, and set it (the demo: "
                        "WEBHOOK_SECRET_ENCRYPTION_KEYS in .env).",
                        id="webhook_receiver.E008",
                    )
                )
                continue
            if len(tokens) < len(values):
                problems.append(
                    checks.Warning(
                        f"Destination {name!r} has signing secrets stored unencrypted.",
                        hint="manage.py migrate encrypts them (webhook_receiver 0010).",
                        id="webhook_receiver.W002",
                    )
                )
    return problems


@checks.register(checks.Tags.database, deploy=True)
def check_destination_secrets_readable(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The destinations no key of SECRET_ENCRYPTION_KEYS decrypts (a key removed before
    ``webhook_destination reencrypt`` ran): ``check --deploy --database default``."""
    try:
        keys = app_settings().secret_encryption_keys
    except ImproperlyConfigured:
        return []  # E001 says why
    if not keys:
        return []  # E008 says so
    problems: list[checks.CheckMessage] = []
    for alias in databases or ():
        try:
            unreadable = destinations_unreadable(using=alias, keys=keys)
        except DatabaseError:
            continue  # not migrated yet
        for pk, name, problem in unreadable:
            if not isinstance(problem, SecretsNotDecrypted):
                continue  # stored unencrypted: W002
            problems.append(
                checks.Error(
                    f"Destination #{pk} {name!r} (database {alias!r}): {problem.state}, "
                    "of WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS']. Nothing is sent to it; "
                    "its messages wait.",
                    hint="Put back the key they were encrypted with (keep it after a new "
                    "one until manage.py webhook_destination reencrypt has run), or set new "
                    "secrets on its admin page (or manage.py webhook_destination update "
                    f"{name} --secret ...).",
                    id="webhook_receiver.E010",
                )
            )
    return problems


@checks.register(checks.Tags.database)
def check_source_records(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A source record whose slug the settings define is never used (settings first):
    say so, since whoever edits it in the admin expects it to count."""
    try:
        configured = app_settings().sources
    except ImproperlyConfigured:
        return []  # E001 says why
    table = WebhookSource._meta.db_table
    problems: list[checks.CheckMessage] = []
    # the slugs alone: nothing to decrypt
    for rows in _raw_rows(databases, f"SELECT slug FROM {table} ORDER BY slug"):
        slugs = [slug for (slug,) in rows]
        problems += [
            checks.Warning(
                f"Source record {slug!r} is shadowed by WEBHOOK_RECEIVER['SOURCES'][{slug!r}]: "
                "the settings' source answers that slug, and the record is never used.",
                hint="Delete the record (admin: webhook sources), or remove the slug from "
                "the settings if the record should serve it.",
                id="webhook_receiver.W005",
            )
            for slug in slugs
            if slug in configured
        ]
    return problems


@checks.register(checks.Tags.database, deploy=True)
def check_source_record_secrets(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Source records whose secrets are too short a key (W006, as W003 for the
    settings'): a GitHub secret a person typed, which the admin keeps with a warning, or
    a record written before the rule. ``check --deploy --database default``."""
    table = WebhookSource._meta.db_table
    problems: list[checks.CheckMessage] = []
    # raw: the model's field would decrypt, and raise, on a record no key reads (that
    # record is the status's and its page's to report)
    for rows in _raw_rows(databases, f"SELECT slug, scheme, secrets FROM {table} ORDER BY slug"):
        for slug, scheme_name, stored in rows:
            values = json.loads(stored) if isinstance(stored, str) else stored
            try:
                secrets = secrets_decrypt(values or [])
                scheme = schemes.get_scheme(scheme_name)
            except (ImproperlyConfigured, LookupError, ValueError):
                continue
            for position, secret in enumerate(secrets, 1):
                weak = weak_secret_problem(scheme, secret)
                if weak:
                    problems.append(
                        checks.Warning(
                            f"Secret #{position} of source record {slug!r} {weak}.",
                            hint=WEAK_SECRET_HINT,
                            id="webhook_receiver.W006",
                        )
                    )
    return problems
