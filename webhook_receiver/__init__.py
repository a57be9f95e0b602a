"""Verified, idempotent webhook ingestion for Django."""

__version__ = "0.1.0"
