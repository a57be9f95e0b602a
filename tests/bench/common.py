"""Constants shared by the bench settings, views and runner (no Django imports here)."""

from __future__ import annotations

# A fixed, bench-only signing secret ("whsec_" + base64 of the HMAC key).
SHOP_SECRET = "whsec_YmVuY2gtb25seS1zZWNyZXQtMjQtYnl0ZXM="
SOURCE = "shop"
TOLERANCE_SECONDS = 300

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench"

FULL_PATH = f"/webhooks/{SOURCE}/"
BARE_PATH = "/floor/bare/"
CLAIM_PATH = "/floor/claim/"

FLOOR_RECEIPT_TABLE = "bench_floor_receipt"
FLOOR_LEDGER_TABLE = "bench_floor_ledger"

# The claim floor's tables: only what its two inserts need, created by the runner
# rather than by migrations so the app's schema stays exactly as shipped.
FLOOR_DDL = (
    f"""
    CREATE TABLE IF NOT EXISTS {FLOOR_RECEIPT_TABLE} (
        id bigserial PRIMARY KEY,
        source varchar(100) NOT NULL,
        event_key varchar(255) NOT NULL,
        received_at timestamptz NOT NULL,
        UNIQUE (source, event_key)
    )
    """,
    f"""
    CREATE TABLE IF NOT EXISTS {FLOOR_LEDGER_TABLE} (
        id bigserial PRIMARY KEY,
        order_id varchar(100) NOT NULL,
        sku varchar(100) NOT NULL,
        delta integer NOT NULL,
        event_key varchar(255) NOT NULL,
        created_at timestamptz NOT NULL
    )
    """,
)
