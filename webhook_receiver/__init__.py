"""Verified, idempotent webhook ingestion for Django."""

__version__ = "0.2.0.dev0"
