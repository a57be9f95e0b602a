"""Inbound sources kept as records (``WebhookSource``), beside those of the settings:
added, rotated, disabled in the admin or with ``manage.py webhook_source``, without a
deploy.

- models: the table; its secrets encrypted at rest like destinations' (core/encryption)
- records: a record read into the same ``SourceConfig`` the settings produce
- lookup: the one way a slug finds its source. The settings first, always: a slug they
  define never costs a query, and no record can shadow it. Then the records, from a
  per-process snapshot at most SOURCE_RECORDS_TTL_SECONDS old, which also answers for
  slugs that are no source at all (a flood of made-up slugs costs one query a TTL).
"""
